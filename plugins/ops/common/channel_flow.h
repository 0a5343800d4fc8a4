#pragma once
// ChannelFlow traits (Note [Op traits]) shared by the op plugins of this repository: how the
// channels tracked by channel removal pass through ONNX's ops. Each answers "kept" (an empty
// answer) whenever it cannot be sure.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "sparsebit/sdk/op_traits.h"

namespace sparsebit::ops {

inline std::vector<std::int64_t> int_values(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous().flatten();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

/// The rank of the tracked input, or -1 when its shape is unknown.
inline std::int64_t tracked_rank(const ChannelQuery& q) {
  const auto* s = q.shape(q.node.inputs[q.input]);
  return s ? static_cast<std::int64_t>(s->size()) : -1;
}

inline std::int64_t normalized_axis(std::int64_t a, std::int64_t rank) { return a < 0 ? a + rank : a; }

/// Axes from attribute `key` or, when the node has no such attribute, from constant input
/// `input` (empty when neither is given); nullopt when the input is not a constant.
inline std::optional<std::vector<std::int64_t>> axes_of(const ChannelQuery& q, const char* key, std::size_t input,
                                                        std::int64_t rank) {
  std::vector<std::int64_t> axes;
  if (q.node.has_attr(key)) {
    axes = q.node.attr_ints(key);
  } else if (q.node.has_input(input)) {
    auto c = q.constant(q.node.inputs[input]);
    if (!c) return std::nullopt;
    axes = int_values(*c);
  }
  for (auto& a : axes) a = normalized_axis(a, rank);
  return axes;
}

inline ChannelFlowAnswer carried_to_output(std::int64_t axis) { return {{{0, axis}}, {}}; }

/// Elementwise on input 0 (activations, unary math, Cast, Identity): other inputs, if any,
/// must be scalars (Clip's bounds).
class SameChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    if (q.input != 0) return {};
    for (std::size_t k = 1; k < q.node.inputs.size(); ++k) {
      if (!q.node.has_input(k)) continue;
      const auto* s = q.shape(q.node.inputs[k]);
      if (!s) return {};
      std::int64_t count = 1;
      for (auto d : *s) count *= d;
      if (count != 1) return {};
    }
    return carried_to_output(q.axis);
  }
};

/// Pooling over the spatial axes of an NC... tensor: channels on axis 1 pass.
class PooledChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    if (q.input != 0 || q.axis != 1 || q.node.outputs.size() > 1) return {};
    return carried_to_output(1);
  }
};

/// Normalization with one constant per channel of axis 1 in every other input
/// (BatchNormalization's scale, bias, mean and variance; InstanceNormalization's scale and bias).
class PerChannelNormalization : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    if (q.input != 0 || q.axis != 1 || q.node.outputs.size() > 1) return {};
    ChannelFlowAnswer a = carried_to_output(1);
    for (std::size_t k = 1; k < q.node.inputs.size(); ++k) a.params.push_back({k, 0});
    return a;
  }
};

}  // namespace sparsebit::ops
