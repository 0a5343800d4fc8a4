#pragma once
/// \file
/// QModules: how one ONNX op runs (with ATen, on whatever device its inputs are on, with
/// whatever shapes arrive) and which of its inputs are quantized.
///
/// A QModule is created once per node, after import, from the node's attributes and the
/// model's opset. Validate attributes in the constructor and throw sparsebit::Error naming
/// node.describe(); the host adds the plugin's name.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/sdk/graph.h"

namespace sparsebit {

/// How the host treats one input of a node.
enum class InputRole {
  kFloat,       ///< never quantized (shapes, indices, biases, pass-through data)
  kActivation,  ///< quantized with the [a] scheme, calibrated on data
  kWeight,      ///< quantized with the [w] scheme; per channel along `channel_axis`
  kBias,        ///< added to the product of the node's kActivation and kWeight inputs:
                ///< int32 at scale s_act * s_weight where the backend quantizes biases
};

struct InputSpec {
  InputRole role = InputRole::kFloat;
  std::int64_t channel_axis = 0;  ///< for kWeight: the output-channel axis of the weight
  /// kWeight read by index (Gather's data: an embedding table, one row per `channel_axis`
  /// index). Quantized only where the config asks ([w] embeddings = true) and only when it is a
  /// constant 2-D float table; otherwise it stays float, never an activation.
  bool lookup_table = false;
  /// A float constant that quantization-aware training learns (BatchNormalization's scale and
  /// bias); kWeight and kBias constants of quantized nodes are trained anyway.
  bool trainable = false;
  /// A float constant the op updates in place while training (running statistics); saved in
  /// QAT checkpoints with the parameters.
  bool training_state = false;
  /// The op reads this input's values on the host (a shape, axes, pads, a count). When the
  /// model runs on a GPU, a small constant here comes as the host copy the executor
  /// keeps (Note [Host copies of shape constants]): no copy from the device and no wait for it
  /// per run, and a training step stays recordable as a CUDA graph. Other values come as they are.
  bool host = false;
};

struct OpContext {
  const Node& node;
  std::int64_t opset;  ///< version of the node's domain imported by the model
  const Graph& graph;  ///< the whole graph, e.g. to read initializers' Graph::narrow_types
};

class QModule {
 public:
  virtual ~QModule() = default;
  /// Role of input i (index into node.inputs); inputs past the end are kFloat.
  virtual std::vector<InputSpec> input_specs() const = 0;
  /// Runs the op. An omitted optional input arrives as an undefined tensor. Must be
  /// differentiable through ATen (QAT runs autograd through it).
  virtual std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) = 0;
  /// QuantModel::train() / eval(): ops that behave differently while training (BatchNormalization
  /// normalizes with batch statistics and updates its running ones in place) switch here.
  virtual void set_training(bool training) { (void)training; }
};

/// A QModule that keeps its node's identity for messages and output counts: the name, op type,
/// domain, inputs and outputs, not the attributes (the constructor has read those). Derive from
/// it instead of keeping a copy of the whole Node: `throw Error(describe() + ": ...")`.
class NodeQModule : public QModule {
 public:
  explicit NodeQModule(const OpContext& c) {
    node_.name = c.node.name;
    node_.op_type = c.node.op_type;
    node_.domain = c.node.domain;
    node_.inputs = c.node.inputs;
    node_.outputs = c.node.outputs;
  }

 protected:
  const Node& node() const { return node_; }
  /// "node 'conv1' (Conv)", for errors.
  std::string describe() const { return node_.describe(); }

 private:
  Node node_;
};

}  // namespace sparsebit
