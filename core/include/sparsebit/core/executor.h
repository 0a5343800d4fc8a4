#pragma once
/// \file
/// The executor: a topological interpreter over QModules. It needs no shape inference (every
/// op runs on the shapes that arrive) and frees each intermediate tensor as soon as its last
/// reader has run.
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
#include <vector>

#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/op.h"

namespace sparsebit {

class Registry;

/// A node's QModule plus where it came from (for messages).
struct BoundModule {
  std::unique_ptr<QModule> module;
  std::string plugin;
};

class SPARSEBIT_API Executor {
 public:
  /// Creates a QModule for every node from the registry. Nodes whose op no plugin provides
  /// are reported together in one Error that names each op type and node. The executor keeps a
  /// reference to `graph`, which must outlive it; the registry need not.
  Executor(const Graph& graph, const Registry& registry);

  /// Called for every present input of every node before it runs; returns the tensor the node
  /// sees (fake-quantized, observed, ...). May be empty.
  using InputHook = std::function<at::Tensor(std::size_t node, std::size_t input, const at::Tensor& value)>;

  /// Runs the graph on `feeds` (graph input name -> tensor), returns the graph outputs in order.
  std::vector<at::Tensor> run(const std::map<std::string, at::Tensor>& feeds, const InputHook& hook = {});

  /// Runs node `index` alone; errors name the node and the plugin.
  std::vector<at::Tensor> run_node(std::size_t index, const std::vector<at::Tensor>& inputs);

  /// Number of node inputs reading each non-constant value (see Note [Release by out-degree]).
  std::map<std::string, int> use_counts() const;

  const Graph& graph() const { return graph_; }
  const std::vector<BoundModule>& modules() const { return modules_; }
  /// Constants (initializers) on the executor's device.
  const std::map<std::string, at::Tensor>& constants() const { return constants_; }
  /// Replaces the executor's copy of constant `name` (the graph's initializer is unchanged).
  void set_constant(const std::string& name, at::Tensor value);
  /// Adds a constant the graph's nodes may then read (the name must be new).
  void add_constant(const std::string& name, at::Tensor value);
  /// Moves constants to `device` ("cpu", "cuda", "cuda:1").
  void to(const std::string& device);

  /// Peak number of intermediate tensors held at once during the last run().
  std::size_t last_peak_live() const { return last_peak_live_; }

 private:
  const Graph& graph_;
  std::vector<BoundModule> modules_;
  std::map<std::string, at::Tensor> constants_;
  std::size_t last_peak_live_ = 0;
};

/// Element type name of a tensor in ONNX terms ("float", "int64", ...).
SPARSEBIT_API std::string dtype_name(const at::Tensor& t);

}  // namespace sparsebit
