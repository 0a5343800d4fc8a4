#pragma once
/// \file
/// The graph IR: ONNX semantics (op_type, domain, attributes, named values, initializers) so
/// that an imported model can be re-emitted faithfully, plus the editing operations passes need.
///
/// Note [Values are names]
/// As in ONNX, an edge is a tensor name: a node's inputs and outputs are names, an empty input
/// name is an omitted optional input, and every name has at most one producer (a node output, a
/// graph input or an initializer). Quantizers, Q/DQ placement and reports all refer to tensors
/// by name, never by position in some traversal, so rewriting the graph cannot misalign them.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

class Graph;

/// One ONNX attribute. A graph-valued attribute (If's branches, Loop's and Scan's body) is a
/// Graph of its own (Note [Subgraphs]); kinds the IR does not interpret (lists of graphs, sparse
/// tensors, type protos) are kept as the serialized AttributeProto and written back unchanged.
struct SPARSEBIT_API Attribute {
  enum class Kind { kFloat, kInt, kString, kTensor, kFloats, kInts, kStrings, kOpaque, kGraph };
  Kind kind = Kind::kInt;
  double f = 0;
  std::int64_t i = 0;
  std::string s;
  at::Tensor t;
  std::vector<double> floats;
  std::vector<std::int64_t> ints;
  std::vector<std::string> strings;
  std::string opaque;            ///< serialized onnx::AttributeProto for Kind::kOpaque
  std::shared_ptr<Graph> graph;  ///< Kind::kGraph (Graph::clone() copies it deeply)

  static Attribute of_int(std::int64_t v);
  static Attribute of_float(double v);
  static Attribute of_string(std::string v);
  static Attribute of_ints(std::vector<std::int64_t> v);
  static Attribute of_floats(std::vector<double> v);
  static Attribute of_tensor(at::Tensor v);
  static Attribute of_graph(Graph g);
  const char* kind_name() const;
};

/// A dimension: a known size, a symbolic name, or unknown (value < 0 and empty param).
struct Dim {
  std::int64_t value = -1;
  std::string param;
};

/// Name, element type (onnx::TensorProto_DataType number) and shape of a graph input/output.
struct ValueInfo {
  std::string name;
  std::int32_t elem_type = 0;
  bool has_shape = false;
  std::vector<Dim> shape;
  std::string doc_string;
};

class SPARSEBIT_API Node {
 public:
  std::string name;
  std::string op_type;
  std::string domain;  ///< "" is the default ONNX domain
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::map<std::string, Attribute> attributes;
  std::string doc_string;

  bool has_attr(const std::string& key) const { return attributes.count(key) != 0; }
  /// Typed accessors; a present attribute of another kind is an Error naming node and key.
  std::int64_t attr_int(const std::string& key, std::int64_t fallback) const;
  double attr_float(const std::string& key, double fallback) const;
  std::string attr_string(const std::string& key, const std::string& fallback) const;
  std::vector<std::int64_t> attr_ints(const std::string& key, const std::vector<std::int64_t>& fallback = {}) const;
  std::vector<double> attr_floats(const std::string& key, const std::vector<double>& fallback = {}) const;
  at::Tensor attr_tensor(const std::string& key) const;
  /// True when input i exists and is not the empty name of an omitted optional input.
  bool has_input(std::size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  /// "node 'conv1' (Conv)" for messages.
  std::string describe() const;
  /// The subgraphs among its attributes (If: then_branch, else_branch; Loop, Scan: body).
  std::vector<const Graph*> subgraphs() const;
  /// Names its subgraphs read from enclosing scopes (Note [Subgraphs]), sorted: values the node
  /// needs besides `inputs`.
  std::vector<std::string> implicit_inputs() const;
};

/// A graph: nodes kept in a valid topological order, graph inputs/outputs, initializers.
/// Node pointers stay valid until the node is erased.
///
/// Note [Subgraphs]
/// A subgraph (an attribute of kind kGraph) is a Graph whose nodes may read, besides its own
/// inputs, initializers and node outputs, any value visible where its node sits (ONNX's outer
/// scope). Such reads are the node's implicit inputs: topological_sort() orders the node after
/// their producers, prune_dead() keeps them, validate() checks they resolve (and validates each
/// subgraph in its scope), replace_all_uses() renames them inside subgraphs too, and
/// unique_name() avoids every name of every nesting level. consumers() lists explicit inputs
/// only: a pass that rewrites a value should check implicit_inputs() of control-flow nodes.
class SPARSEBIT_API Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  /// Deep copy of the structure; tensors are shared (at::Tensor is reference counted), so
  /// clone and clone the tensors you intend to modify in place.
  Graph clone() const;

  std::vector<ValueInfo> inputs;  ///< graph inputs, without initializers
  std::vector<ValueInfo> outputs;
  std::map<std::string, at::Tensor> initializers;
  /// ONNX element types of initializers that at::Tensor cannot hold: the tensor carries the
  /// values widened (int4 -> int8, uint4 -> uint8) and export packs them back. Keyed by name.
  std::map<std::string, std::int32_t> narrow_types;
  std::map<std::string, std::int64_t> opset_imports;  ///< domain -> version

  /// Opset version of the default domain ("" or "ai.onnx"); 0 if none is imported.
  std::int64_t default_opset() const;

  // -- nodes -------------------------------------------------------------------------------
  std::size_t num_nodes() const;
  Node& node(std::size_t index);
  const Node& node(std::size_t index) const;
  std::vector<Node*> nodes();
  std::vector<const Node*> nodes() const;
  Node* find_node(const std::string& name);

  Node* append(Node n);
  Node* insert_before(const Node* position, Node n);
  Node* insert_after(const Node* position, Node n);
  void erase(const Node* n);

  // -- values ------------------------------------------------------------------------------
  /// The node producing `value`, or nullptr for graph inputs, initializers and unknown names.
  Node* producer(const std::string& value);
  const Node* producer(const std::string& value) const;
  /// Every (node, input index) that reads `value`.
  std::vector<std::pair<Node*, std::size_t>> consumers(const std::string& value);
  std::vector<std::pair<const Node*, std::size_t>> consumers(const std::string& value) const;
  bool is_graph_output(const std::string& value) const;
  bool is_graph_input(const std::string& value) const;
  /// Point every reader of `from` (node inputs and graph outputs) at `to`.
  void replace_all_uses(const std::string& from, const std::string& to);
  /// A tensor name not used anywhere in the graph, derived from `base`.
  std::string unique_name(const std::string& base) const;

  // -- whole-graph utilities -----------------------------------------------------------------
  /// Reorders nodes topologically (stable: keeps the existing order where it is valid).
  /// Throws an Error naming a node on a cycle or an input nobody produces.
  void topological_sort();
  /// Removes nodes whose outputs nobody reads and initializers nobody uses; returns how many
  /// nodes were removed.
  std::size_t prune_dead();
  /// Checks every input name has a producer and every name has one producer, also inside
  /// subgraphs; throws Error.
  void validate() const;
  /// Names read by this graph's nodes (implicitly too) that it does not define itself: what a
  /// subgraph takes from enclosing scopes.
  std::vector<std::string> outer_reads() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparsebit
