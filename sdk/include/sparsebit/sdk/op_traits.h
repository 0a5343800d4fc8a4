#pragma once
/// \file
/// What the core asks of an op besides running it (SDK 1.1).
///
/// Note [Op traits]
/// An op plugin registers traits beside its QModule: `r.add_op_traits<MyTraits>("MyOp", "com.acme")`.
/// Each trait is an interface of its own, derived from OpTraits, that one class may implement
/// together with others (as a quantizer implements its capabilities, Note [Capabilities]); the
/// core looks each one up with dynamic_cast when it needs that knowledge and treats an op without
/// it conservatively (channel removal keeps the channels that reach it). One traits object serves
/// every node of the op type, so it keeps no per-node state: everything arrives in the query.
/// Traits are registered by the plugin that registers the op (the host refuses traits for an op
/// the plugin does not register). New traits arrive as new interfaces in later minor versions.

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/sdk/batchnorm.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

class OpTraits {
 public:
  virtual ~OpTraits() = default;
};

/// One node seen by the channel analysis of channel removal (docs/PRUNING.md): the channels of
/// input `input` run along its axis `axis` (non-negative) and number `channels`.
struct ChannelQuery {
  const Node& node;
  const Graph& graph;
  std::int64_t opset;  ///< version of the node's domain imported by the model
  std::size_t input;
  std::int64_t axis;
  std::int64_t channels;
  /// The static shape of a value as the sample run saw it, or nullptr when unknown.
  std::function<const std::vector<std::int64_t>*(const std::string&)> shape;
  /// The value of a constant input (an initializer or a Constant node's output), if it is one.
  std::function<std::optional<at::Tensor>(const std::string&)> constant;
};

/// Where the channels of a ChannelQuery go.
struct ChannelFlowAnswer {
  struct Axis {
    std::size_t index;  ///< an output (in `outputs`) or an input (in `params`) of the node
    std::int64_t axis;  ///< its channel axis, non-negative
  };
  /// The outputs that carry the same channels, in the same order, with their channel axis.
  /// Empty: the op mixes or reorders the channels, and the channels reaching it are kept.
  std::vector<Axis> outputs;
  /// Constant inputs with one entry per channel along `axis` (a per-channel scale, a running
  /// mean): sliced with the channels. Optional inputs the node omits are not listed.
  std::vector<Axis> params;
};

/// How channels pass through the op, for channel removal: for an op that carries the channels
/// of one input through to its outputs. Ops that create channels (Conv, Gemm, MatMul) and
/// Concat, Flatten and Reshape are the core's own.
class ChannelFlow : public virtual OpTraits {
 public:
  virtual ChannelFlowAnswer channel_flow(const ChannelQuery& q) const = 0;
};

/// The op combines its inputs elementwise under numpy broadcasting (Add, Mul, Where) into its
/// first output: the channels of inputs that line up on the output's axes must go together, and
/// a constant input that spans the channel axis is sliced with them.
class Elementwise : public virtual OpTraits {};

/// The axes of a WeightedLayer: its weight's output channels, the weight axis reduced with the
/// activation's channels, the activation's channel axis (-1: its last), and the output's channel
/// axis (-1: its last; unset: the same as the activation's, as in Conv, Gemm and MatMul).
struct LayerAxes {
  std::int64_t weight_out = 0;
  std::int64_t weight_in = 1;
  std::int64_t activation = 1;
  std::optional<std::int64_t> output;
  std::int64_t output_axis() const { return output.value_or(activation); }
};

/// Sums of a layer's activation over calibration data, whose mean bias_shift() reads.
struct ActivationSums {
  at::Tensor sum;    ///< double; undefined when the layer gathers none
  double count = 0;  ///< the values summed into each entry
};

/// A layer that multiplies its activation (input 0) by a weight (input 1), as Conv, Gemm and
/// MatMul do: what channel removal (scores, bias compensation, the layers it reports) and the
/// model statistics (MACs) ask of it.
class WeightedLayer : public virtual OpTraits {
 public:
  /// The axes for this node and a weight of rank `weight_rank`; nullopt when the layer does not
  /// take a weight of that rank.
  virtual std::optional<LayerAxes> axes(const Node& node, std::int64_t weight_rank) const = 0;
  /// Multiply-accumulates of one run given the activation's, the weight's and (nullptr when
  /// unknown) the output's shape; 0 when they do not tell.
  virtual std::int64_t macs(const Node& node, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w,
                            const std::vector<std::int64_t>* y) const = 0;
  /// The weight as one row per output channel along everything it is reduced over, in the order
  /// integer kernels add consecutive products (ONNX Runtime's u8 x s8 kernels on processors
  /// without VNNI add them two by two into 16 bits; the core checks those pairs for saturation).
  /// Undefined when no integer kernel runs the layer. By default: the output axis first, the
  /// input axis last, the others between, as a channels-last convolution reads them.
  virtual at::Tensor reduction_rows(const Node& node, const at::Tensor& w) const {
    const auto a = axes(node, w.dim());
    if (!a || w.dim() < 2) return {};
    std::vector<std::int64_t> order{a->weight_out};
    for (std::int64_t d = 0; d < w.dim(); ++d)
      if (d != a->weight_out && d != a->weight_in) order.push_back(d);
    order.push_back(a->weight_in);
    return w.permute(order).reshape({w.size(a->weight_out), -1});
  }
  /// The groups its channels are split into, each multiplied by its own part of the weight
  /// (Conv's `group`); 1 for a dense layer. Channel removal slices grouped layers only when
  /// they are depthwise.
  virtual std::int64_t groups(const Node& /*node*/) const { return 1; }
  /// The input added to the product (Conv's B, Gemm's C), whose last axis runs along the output
  /// channels (or has extent 1); nullopt when the layer has none. Channel removal slices it
  /// with the output channels.
  virtual std::optional<std::size_t> bias_input(const Node& /*node*/) const { return std::nullopt; }
  /// The activation's statistics that bias_shift() reads, summed over one batch `x` (input 0)
  /// for a weight of rank `weight_rank`. By default the sum per activation channel over every
  /// other axis; undefined `sum` when axes() does not answer.
  virtual ActivationSums activation_sums(const Node& node, const at::Tensor& x, std::int64_t weight_rank) const {
    const auto a = axes(node, weight_rank);
    if (!a || x.dim() == 0) return {};
    const std::int64_t axis = a->activation < 0 ? a->activation + x.dim() : a->activation;
    if (axis < 0 || axis >= x.dim()) return {};
    std::vector<std::int64_t> others;
    for (std::int64_t d = 0; d < x.dim(); ++d)
      if (d != axis) others.push_back(d);
    const at::Tensor xd = x.to(at::kDouble);
    return {others.empty() ? xd : xd.sum(others),
            static_cast<double>(x.numel() / std::max<std::int64_t>(1, x.size(axis)))};
  }
  /// What the bias input (bias_input()) must gain, per output channel, to keep the output's
  /// mean when the weight loses `delta` (old weight minus new, double), given the activation's
  /// mean as activation_sums() gathered it (sum / count). Channel removal and element pruning
  /// add it (Note [Bias compensation] in docs/PRUNING.md). Undefined where a bias cannot express
  /// the change (the default).
  virtual at::Tensor bias_shift(const Node& /*node*/, const at::Tensor& /*delta*/, const at::Tensor& /*mean*/) const {
    return {};
  }
  /// What the output multiplies the bias input by (Gemm's beta); 1 by default.
  virtual double bias_factor(const Node& /*node*/) const { return 1.0; }
};

/// An op that, in inference, normalizes input 0 per channel along axis 1 with running
/// statistics held in constant inputs (BatchNormalization). BN re-estimation (`bn_tuning`)
/// rewrites those statistics from calibration data, and the QDQ export folds the op into a
/// WeightedLayer before it whose weight is quantized per output channel
/// (Note [BatchNormalization as an affine map]).
class RunningStatistics : public virtual OpTraits {
 public:
  struct Inputs {
    std::size_t mean, var;
  };
  /// The inputs holding the running mean and variance; nullopt when the node omits them.
  virtual std::optional<Inputs> statistics_inputs(const Node& node) const = 0;
  /// y = x k + shift per channel, from the graph's constants; nullopt when the node is not
  /// that (training mode, parameters that are computed).
  virtual std::optional<BatchNormAffine> affine(const Graph& graph, const Node& node) const = 0;
};

/// Checks of a node that its ONNX schema cannot express (a Conv's kernel_shape against its
/// weight), run when a model is imported, before any work: what a runtime would refuse at
/// session creation is refused there.
class ChecksAtImport : public virtual OpTraits {
 public:
  /// Throws an Error saying what is wrong and what to do; the host adds the file's name.
  virtual void check(const Node& node, const Graph& graph) const = 0;
};

/// What a lifting rule reads and changes (Note [Opset lifting] in the core's opset_lift.h): the
/// host implements it for each graph it lifts. Facts come from the model's declarations, a
/// light propagation and one run of the float model on a sample; a value the host knows nothing
/// about has rank -1 and element type 0.
class LiftContext {
 public:
  virtual ~LiftContext() = default;
  virtual Graph& graph() = 0;
  /// The opset the model is lifted to.
  virtual std::int64_t target() const = 0;
  virtual std::int64_t rank(const std::string& value) const = 0;
  /// ONNX's element type number (1 float, 7 int64, ...).
  virtual std::int32_t elem_type(const std::string& value) const = 0;
  /// Its dims (-1 for one that is not known), or empty when not even the rank is known.
  virtual std::vector<std::int64_t> dims(const std::string& value) const = 0;
  /// One line for the lift report, about `node`.
  virtual void note(const Node& node, const std::string& what) = 0;
  /// Stops the lift with an error naming the node, the opsets and `why` (say what to do).
  [[noreturn]] virtual void refuse(const Node& node, const std::string& why) const = 0;

  /// Adds `value` as an initializer named after the node and `what`; returns its name.
  std::string constant(const Node& node, const std::string& what, at::Tensor value) {
    const std::string name = graph().unique_name(node.name + "_" + what);
    graph().initializers[name] = std::move(value);
    return name;
  }
  /// Makes `name` input `index` of the node, padding skipped optional inputs with "".
  static void set_input(Node& node, std::size_t index, const std::string& name) {
    if (node.inputs.size() <= index) node.inputs.resize(index + 1);
    node.inputs[index] = name;
  }
  /// Moves an ints attribute to input `index` as an int64 initializer (nothing without it).
  void attribute_to_input(Node& node, const std::string& attribute, std::size_t index) {
    if (!node.has_attr(attribute)) return;
    const auto values = node.attr_ints(attribute);
    node.attributes.erase(attribute);
    set_input(node, index, constant(node, attribute, at::tensor(values, at::kLong)));
    note(node, "'" + attribute + "' attribute -> input " + std::to_string(index));
  }
  /// Whether a value is read by a node or is a graph output.
  bool read_elsewhere(const std::string& value) {
    return !value.empty() && (!graph().consumers(value).empty() || graph().is_graph_output(value));
  }
};

/// How a default-domain op is lifted to a newer opset (the core lifts models older than the
/// opset its export needs). An op of the default domain without this trait stops the lift.
class LiftsOpset : public virtual OpTraits {
 public:
  /// The opsets, ascending, from which the op means something else than in the version before
  /// (from opset 7 on); empty when its meaning never changed (new versions only widened types
  /// or added attributes and inputs whose defaults keep the old behaviour).
  virtual std::vector<std::int64_t> lift_versions() const = 0;
  /// Rewrites `node` from the meaning before `version` (one of lift_versions()) to the meaning
  /// at `version`. It may change the op type (Upsample -> Resize): the new op's steps follow.
  /// It never erases a node and keeps the position of every input it does not add.
  virtual void lift(LiftContext& context, Node& node, std::int64_t version) const {
    (void)node;
    (void)version;
    (void)context;
  }
  /// The version a node of this op has in a model importing opset `opset`: `opset`, except for
  /// an op removed from the standard, which keeps its last version's meaning.
  virtual std::int64_t read_as(std::int64_t opset) const { return opset; }
};

/// An op whose meaning did not change from opset 7 on.
class SameMeaningAcrossOpsets : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {}; }
};

/// One traits object made of several traits, for `r.add_op_traits<TraitsOf<A, B>>(op)`.
template <class... Traits>
class TraitsOf final : public Traits... {};

}  // namespace sparsebit
