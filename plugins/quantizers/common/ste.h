#pragma once
// Straight-through helpers shared by the learnable quantizers of this repository.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "sparsebit/sdk/quant.h"

namespace sparsebit::quantizers {

/// round(v) forward, identity backward.
inline at::Tensor round_ste(const at::Tensor& v) { return v + (at::round(v) - v).detach(); }

/// value p forward, gradient scaled by g backward (LSQ's gradient scaling).
inline at::Tensor grad_scale(const at::Tensor& p, double g) { return (p - p * g).detach() + p * g; }

/// Reshapes per-channel parameters to broadcast along spec.channel_axis of x.
inline at::Tensor along_channel(const at::Tensor& p, const at::Tensor& x, const QSpec& spec) {
  if (!spec.per_channel || p.dim() == 0) return p;
  const std::int64_t axis = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[static_cast<std::size_t>(axis)] = p.numel();
  return p.reshape(shape);
}

/// x with the channel axis first, flattened per channel: [C, N] (per tensor: [1, numel]).
inline at::Tensor rows_of(const at::Tensor& x, const QSpec& spec) {
  if (!spec.per_channel) return x.reshape({1, -1});
  const std::int64_t axis = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
  return x.movedim(axis, 0).reshape({x.size(axis), -1});
}

}  // namespace sparsebit::quantizers
