#pragma once
/// \file
/// Subgraph pattern matching and rewriting, for passes.
///
/// A Pattern is a small DAG of pattern nodes, each naming the op types it accepts (or any op)
/// and which pattern nodes produce its inputs. The last node added is the root: matching starts
/// from every graph node that fits the root and walks producers backwards. Example (x * HardSigmoid(x)
/// in either operand order, folded into one HardSwish):
///
///     Pattern p;
///     p.node("hs", {"HardSigmoid"}, {""}, Inputs::kOrdered,
///            [](const Node& n, const Graph&) { return n.attr_float("alpha", 0.2) == 1.0 / 6; });
///     p.node("mul", {"Mul"}, {"hs"}, Inputs::kAnyOrder);
///     p.joint([](const Match& m, const Graph&) {   // the Mul's other operand is the HardSigmoid's input
///       const Node& mul = *m.at("mul");
///       return mul.inputs[0] == m.at("hs")->inputs[0] || mul.inputs[1] == m.at("hs")->inputs[0];
///     });
///     rewrite(graph, p, [](Graph& g, const Match& m) { ...insert a HardSwish, redirect uses...; return true; });
///
/// Rules:
///   - Inputs::kOrdered: input i of the graph node must be produced by the pattern node named at
///     position i ("" = any value, and the node may have more inputs than listed).
///   - Inputs::kAnyOrder: each listed pattern node must produce some input of the graph node,
///     distinct inputs for distinct entries, in any order; other inputs are free.
///   - A pattern node used by several others matches one graph node.
///   - Every matched node except the root must have all its readers inside the match and must
///     not produce a graph output, so the rewrite can drop it (unless allow_external_uses()).
///   - Matches do not overlap: graph nodes are tried as roots in order, and a candidate sharing a
///     node with an accepted match is skipped.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sparsebit/sdk/export.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

/// Pattern node name -> matched graph node.
class SPARSEBIT_API Match {
 public:
  Node* at(const std::string& pattern_node) const;
  const std::map<std::string, Node*>& nodes() const { return nodes_; }
  std::map<std::string, Node*>& mutable_nodes() { return nodes_; }

 private:
  std::map<std::string, Node*> nodes_;
};

class SPARSEBIT_API Pattern {
 public:
  enum class Inputs { kOrdered, kAnyOrder };
  using NodeCheck = std::function<bool(const Node&, const Graph&)>;
  using JointCheck = std::function<bool(const Match&, const Graph&)>;

  /// Adds a pattern node. `op_types` empty = any op of the default domain. `inputs` names earlier
  /// pattern nodes ("" = unconstrained position). The last node added is the root.
  Pattern& node(const std::string& name, std::vector<std::string> op_types, std::vector<std::string> inputs = {},
                Inputs mode = Inputs::kOrdered, NodeCheck check = {});
  /// A check over the whole match, run after every node fits.
  Pattern& joint(JointCheck check);
  /// Lets inner nodes be read outside the match (the rewrite must then keep them).
  Pattern& allow_external_uses(bool allow = true);

  /// Non-overlapping matches in graph order.
  std::vector<Match> find(Graph& graph) const;

  struct PatternNode {
    std::string name;
    std::vector<std::string> op_types;
    std::vector<std::string> inputs;
    Inputs mode = Inputs::kOrdered;
    NodeCheck check;
  };
  const std::vector<PatternNode>& pattern_nodes() const { return nodes_; }

 private:
  struct Index {
    std::map<std::string, Node*> producer;
    std::map<std::string, std::vector<Node*>> readers;
  };
  bool match_node(std::size_t index, Node* candidate, const Graph& graph, const Index& idx, Match& m) const;
  std::vector<PatternNode> nodes_;
  std::vector<JointCheck> joint_;
  bool external_uses_ = false;
};

/// Replaces one match: add new nodes, point readers of the root's outputs at them
/// (Graph::replace_all_uses); leave the old nodes, they are pruned. Return false to decline.
using Rewrite = std::function<bool(Graph& graph, const Match& match)>;

/// Finds matches and rewrites them; then prunes what became dead and restores topological order.
/// With `repeat`, searches again until no match is rewritten (at most 100 rounds). Returns the
/// number of rewrites.
SPARSEBIT_API std::size_t rewrite(Graph& graph, const Pattern& pattern, const Rewrite& fn, bool repeat = true);

}  // namespace sparsebit
