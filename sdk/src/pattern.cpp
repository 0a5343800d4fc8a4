#include "sparsebit/sdk/pattern.h"

#include <algorithm>
#include <set>

#include "sparsebit/sdk/error.h"

namespace sparsebit {

Node* Match::at(const std::string& pattern_node) const {
  auto it = nodes_.find(pattern_node);
  if (it == nodes_.end()) throw Error("pattern node '" + pattern_node + "' is not part of this match");
  return it->second;
}

Pattern& Pattern::node(const std::string& name, std::vector<std::string> op_types, std::vector<std::string> inputs,
                       Inputs mode, NodeCheck check) {
  if (name.empty()) throw Error("pattern nodes need a name");
  for (const auto& n : nodes_)
    if (n.name == name) throw Error("pattern node '" + name + "' is defined twice");
  for (const auto& in : inputs) {
    if (in.empty()) continue;
    bool known = false;
    for (const auto& n : nodes_) known = known || n.name == in;
    if (!known) throw Error("pattern node '" + name + "' reads '" + in + "', which is not defined before it");
  }
  nodes_.push_back({name, std::move(op_types), std::move(inputs), mode, std::move(check)});
  return *this;
}

Pattern& Pattern::joint(JointCheck check) {
  joint_.push_back(std::move(check));
  return *this;
}

Pattern& Pattern::allow_external_uses(bool allow) {
  external_uses_ = allow;
  return *this;
}

bool Pattern::match_node(std::size_t index, Node* candidate, const Graph& graph, const Index& idx, Match& m) const {
  const PatternNode& pn = nodes_[index];
  auto& bound = m.mutable_nodes();
  if (auto it = bound.find(pn.name); it != bound.end()) return it->second == candidate;
  if (!candidate->domain.empty()) return false;
  if (!pn.op_types.empty() &&
      std::find(pn.op_types.begin(), pn.op_types.end(), candidate->op_type) == pn.op_types.end())
    return false;
  for (const auto& [name, node] : bound)
    if (node == candidate) return false;  // one graph node per pattern node
  if (pn.check && !pn.check(*candidate, graph)) return false;

  const Match before = m;
  bound[pn.name] = candidate;
  auto index_of = [this](const std::string& name) {
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].name == name) return i;
    return nodes_.size();
  };
  auto producer_matches = [&](const std::string& pattern_input, const std::string& value) {
    if (value.empty()) return false;
    auto p = idx.producer.find(value);
    return p != idx.producer.end() && match_node(index_of(pattern_input), p->second, graph, idx, m);
  };

  bool ok = true;
  if (pn.mode == Inputs::kOrdered) {
    for (std::size_t i = 0; i < pn.inputs.size() && ok; ++i) {
      if (pn.inputs[i].empty()) continue;
      ok = i < candidate->inputs.size() && producer_matches(pn.inputs[i], candidate->inputs[i]);
    }
  } else {
    // Assign each listed pattern input to a distinct graph input, backtracking over choices.
    std::vector<std::string> wanted;
    for (const auto& in : pn.inputs)
      if (!in.empty()) wanted.push_back(in);
    std::vector<bool> taken(candidate->inputs.size(), false);
    std::function<bool(std::size_t)> assign = [&](std::size_t w) {
      if (w == wanted.size()) return true;
      for (std::size_t i = 0; i < candidate->inputs.size(); ++i) {
        if (taken[i]) continue;
        const Match saved = m;
        taken[i] = true;
        if (producer_matches(wanted[w], candidate->inputs[i]) && assign(w + 1)) return true;
        taken[i] = false;
        m = saved;
      }
      return false;
    };
    ok = assign(0);
  }
  if (!ok) m = before;
  return ok;
}

std::vector<Match> Pattern::find(Graph& graph) const {
  std::vector<Match> matches;
  if (nodes_.empty()) return matches;
  // Producer and reader maps once per search (Graph's own lookups scan the node list).
  Index idx;
  for (Node* n : graph.nodes()) {
    for (const auto& o : n->outputs)
      if (!o.empty()) idx.producer[o] = n;
    for (const auto& in : n->inputs)
      if (!in.empty()) idx.readers[in].push_back(n);
  }
  std::set<const Node*> used;
  for (Node* root : graph.nodes()) {
    if (used.count(root)) continue;
    Match m;
    if (!match_node(nodes_.size() - 1, root, graph, idx, m)) continue;
    bool ok = true;
    std::set<const Node*> members;
    for (const auto& [name, node] : m.nodes()) {
      members.insert(node);
      ok = ok && !used.count(node);
    }
    if (ok && !external_uses_) {
      for (const auto& [name, node] : m.nodes()) {
        if (node == root) continue;
        for (const auto& out : node->outputs) {
          if (out.empty()) continue;
          if (graph.is_graph_output(out)) ok = false;
          if (auto r = idx.readers.find(out); r != idx.readers.end())
            for (const Node* reader : r->second) ok = ok && members.count(reader);
        }
      }
    }
    for (const auto& check : joint_) ok = ok && check(m, graph);
    if (!ok) continue;
    used.insert(members.begin(), members.end());
    matches.push_back(std::move(m));
  }
  return matches;
}

std::size_t rewrite(Graph& graph, const Pattern& pattern, const Rewrite& fn, bool repeat) {
  std::size_t total = 0;
  for (int round = 0; round < 100; ++round) {
    std::size_t done = 0;
    for (const Match& m : pattern.find(graph)) done += fn(graph, m) ? 1 : 0;
    if (done > 0) {
      graph.prune_dead();
      graph.topological_sort();
    }
    total += done;
    if (!repeat || done == 0) break;
  }
  return total;
}

}  // namespace sparsebit
