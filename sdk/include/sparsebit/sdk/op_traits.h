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

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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
/// activation's channels, and the activation's channel axis (-1: its last).
struct LayerAxes {
  std::int64_t weight_out = 0;
  std::int64_t weight_in = 1;
  std::int64_t activation = 1;
};

/// A layer that multiplies its activation (input 0) by a weight (input 1), as Conv, Gemm and
/// MatMul do: what channel removal (scores, bias compensation, the layers it reports) and the
/// model statistics (MACs) ask of it.
class WeightedLayer : public virtual OpTraits {
 public:
  /// The axes for this node and a weight of rank `weight_rank`; nullopt when the node is not a
  /// plain layer (a Gemm with a transposed activation).
  virtual std::optional<LayerAxes> axes(const Node& node, std::int64_t weight_rank) const = 0;
  /// Multiply-accumulates of one run given the activation's, the weight's and (nullptr when
  /// unknown) the output's shape; 0 when they do not tell.
  virtual std::int64_t macs(const Node& node, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w,
                            const std::vector<std::int64_t>* y) const = 0;
};

}  // namespace sparsebit
