#pragma once
/// \file
/// The executor: a topological interpreter over QModules. It needs no shape inference (every
/// op runs on the shapes that arrive) and frees each intermediate tensor as soon as its last
/// reader has run.
///
/// Note [Control flow]
/// If, Loop and Scan run in the executor itself, not in a plugin: each holds an executor per
/// subgraph, and runs it with the values its bodies read from enclosing scopes (its implicit
/// inputs, Note [Subgraphs] in graph.h) visible. Those values count as reads of the node for
/// release. Body nodes run in float: the input hook sees the nodes of the graph it was given
/// only, so quantizers and observers act outside bodies.
///
/// Note [Release by out-degree]
/// Before a run, every non-constant value gets a count of the node inputs that read it (a
/// node reading it twice counts twice). After a node runs, the count of each of its inputs
/// drops by one; a value reaching zero is released unless it is a graph output. The layerwise
/// calibration runner uses the same counts over its per-batch caches, releasing explicitly
/// rather than relying on destructors.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/op.h"

namespace sparsebit {

class Registry;

/// A node's QModule plus where it came from (for messages). Control-flow nodes get a module of
/// the core's that quantizes nothing (Note [Control flow]).
struct BoundModule {
  std::unique_ptr<QModule> module;
  std::string plugin;
};

/// If, Loop or Scan of the default domain: run by the executor (Note [Control flow]).
SPARSEBIT_API bool is_control_flow(const Node& n);

/// Note [Flat node numbering]
/// Quantization, profiling and the accuracy target address nodes of every nesting level by one
/// number. A graph's own nodes come first, in topological order; then, for each control-flow node
/// in that order, its bodies in attribute-name order (If: else_branch, then_branch), each
/// numbered the same way, recursively. Executor::number and flat_nodes() walk alike, so the
/// number a QuantModel records for a node names the same node in a fresh flat_nodes() of the
/// same graph; a control-flow node's bodies take the contiguous range [first, last).
/// A node of some nesting level and the graph that holds it.
struct FlatNode {
  Node* node;
  Graph* graph;
};
/// Every node of `g` and of its control-flow bodies, in flat order (Note [Flat node numbering]).
SPARSEBIT_API std::vector<FlatNode> flat_nodes(Graph& g);

/// Wall time one op type took over the runs of an executor with op timing on.
struct OpTime {
  double seconds = 0;       ///< in the nodes' forward (a control-flow node: its bodies, hooks included)
  double hook_seconds = 0;  ///< in the input hook at the nodes' inputs (observers, fake quantization)
  std::int64_t calls = 0;
};

class SPARSEBIT_API Executor {
 public:
  /// Creates a QModule for every node from the registry. Nodes whose op no plugin provides
  /// are reported together in one Error that names each op type and node. The executor keeps a
  /// reference to `graph`, which must outlive it; the registry need not.
  Executor(const Graph& graph, const Registry& registry);

  /// Called for every present input of every node before it runs, body nodes included, with the
  /// node's flat number (Note [Flat node numbering]); returns the tensor the node sees
  /// (fake-quantized, observed, ...). May be empty.
  using InputHook = std::function<at::Tensor(std::size_t node, std::size_t input, const at::Tensor& value)>;

  ~Executor();

  /// Runs the graph on `feeds` (graph input name -> tensor), returns the graph outputs in order.
  /// `outer`: values of enclosing scopes a subgraph reads (Note [Control flow]). The first run
  /// of a top-level graph checks its outputs against their declarations (Note [Declared outputs]).
  std::vector<at::Tensor> run(const std::map<std::string, at::Tensor>& feeds, const InputHook& hook = {},
                              const std::map<std::string, at::Tensor>* outer = nullptr);

  /// Runs node `index` alone; errors name the node and the plugin. A control-flow node whose
  /// bodies read enclosing values needs them in `scope`; `hook` acts on its body nodes.
  std::vector<at::Tensor> run_node(std::size_t index, const std::vector<at::Tensor>& inputs,
                                   const std::map<std::string, at::Tensor>& scope = {}, const InputHook& hook = {});

  /// Enclosing values the subgraphs of control-flow node `index` read (empty for other nodes).
  const std::vector<std::string>& implicit_inputs(std::size_t index) const;
  /// Those values for a node-by-node run: from the constants, else from `values`.
  std::map<std::string, at::Tensor> scope_of(std::size_t index, const std::map<std::string, at::Tensor>& values) const;

  /// Number of node inputs reading each non-constant value (see Note [Release by out-degree]).
  std::map<std::string, int> use_counts() const;

  const Graph& graph() const { return graph_; }
  /// The modules of the graph's own nodes (index = node index).
  const std::vector<BoundModule>& modules() const { return modules_; }

  // -- nodes of every nesting level, by flat number (Note [Flat node numbering]) --------------
  std::size_t flat_size() const { return flat_.size(); }
  const Node& flat_node(std::size_t flat) const;
  const BoundModule& flat_module(std::size_t flat) const;
  /// Runs flat node `flat` alone, at any nesting level (a control-flow node there needs the
  /// enclosing scope: run those with run_node at the top level).
  std::vector<at::Tensor> run_flat_node(std::size_t flat, const std::vector<at::Tensor>& inputs);
  /// The constant `name` as flat node `flat` sees it (its graph's, else an enclosing one's), or null.
  const at::Tensor* flat_constant(std::size_t flat, const std::string& name) const;
  /// The flat numbers [first, last) of the nodes nested under node `index` (empty for nodes
  /// without subgraphs).
  std::pair<std::size_t, std::size_t> nested_range(std::size_t index) const;
  /// The node of this graph under which flat node `flat` is nested (itself for a node of this graph).
  std::size_t enclosing_node(std::size_t flat) const;
  /// Constants (initializers) on the executor's device.
  const std::map<std::string, at::Tensor>& constants() const { return constants_; }
  /// Replaces the executor's copy of constant `name` (the graph's initializer is unchanged).
  void set_constant(const std::string& name, at::Tensor value);
  /// Adds a constant the graph's nodes may then read (the name must be new).
  void add_constant(const std::string& name, at::Tensor value);
  /// Moves constants to `device` ("cpu", "cuda", "cuda:1").
  void to(const std::string& device);

  /// Note [Op timing]: with timing on, every run() adds each node's wall time, and that of the
  /// hook at its inputs, to its op type's entry. CPU ops finish before they return, so the times
  /// are exact there; on a GPU they are launch times unless something synchronises.
  void set_op_timing(bool on) { op_timing_ = on; }
  const std::map<std::string, OpTime>& op_times() const { return op_times_; }
  void reset_op_times() { op_times_.clear(); }

  /// Peak number of intermediate tensors held at once during the last run().
  std::size_t last_peak_live() const { return last_peak_live_; }

 private:
  struct ControlFlow;
  struct FlatEntry {
    Executor* owner;    // this executor or one of its bodies', which it owns
    std::size_t index;  ///< in owner's graph
  };
  Executor(const Graph& graph, const Registry& registry, const Executor* parent);
  /// Numbers this executor's nodes from `flat.size()` on, then its bodies' (Note [Flat node numbering]).
  void number(std::vector<FlatEntry>& flat);
  /// Whether node `index`'s op reads input `input` on the host (InputSpec::host).
  bool reads_on_host(std::size_t index, std::size_t input) const;
  std::vector<at::Tensor> run_control_flow(std::size_t index, const std::vector<at::Tensor>& inputs,
                                           const std::map<std::string, at::Tensor>& scope, const InputHook& hook);

  const Graph& graph_;
  const Executor* parent_ = nullptr;  ///< the executor whose control-flow node runs this body
  std::size_t base_ = 0;              ///< flat number of this graph's node 0
  std::vector<FlatEntry> flat_;       ///< the top-level executor's numbering (empty in bodies)
  std::vector<BoundModule> modules_;
  std::map<std::size_t, std::unique_ptr<ControlFlow>> control_;  ///< node index -> its subgraph executors
  std::map<std::string, at::Tensor> constants_;
  /// Note [Host copies of shape constants]: the host copies of small integer constants kept
  /// when to() moves the constants to a GPU.
  std::map<std::string, at::Tensor> host_constants_;
  std::size_t last_peak_live_ = 0;
  bool op_timing_ = false;
  bool outputs_checked_ = false;  ///< Note [Declared outputs]: the first run's outputs were compared
  std::map<std::string, OpTime> op_times_;
};

/// A sequence value as the executor carries it (Note [Sequence values] in
/// plugins/ops/sequence/sequence_ops.cpp): a nested tensor of `items`, all of one rank.
SPARSEBIT_API at::Tensor sequence_of(const std::vector<at::Tensor>& items, at::ScalarType dtype);

/// Element type name of a tensor in ONNX terms ("float", "int64", ...).
SPARSEBIT_API std::string dtype_name(const at::Tensor& t);

}  // namespace sparsebit
