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

/// Parameters broadcast against x (per channel or per group; see sparsebit/sdk/quant.h).
inline at::Tensor along_channel(const at::Tensor& p, const at::Tensor& x, const QSpec& spec) {
  return expand_param(p, x, spec);
}

/// Per-row statistic (rows of quant_rows) shaped like the parameters of x.
inline at::Tensor per_scale(const at::Tensor& row_values, const at::Tensor& x, const QSpec& spec) {
  return rows_to_params(row_values, std::vector<std::int64_t>(x.sizes().begin(), x.sizes().end()), spec);
}

}  // namespace sparsebit::quantizers
