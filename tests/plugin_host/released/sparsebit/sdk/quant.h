#pragma once
/// \file
/// What a quantizer computes with: the scheme of one quantized tensor (QSpec) and its
/// parameters (QParams), plus the reference arithmetic every observer and quantizer shares.
///
/// Note [Quantization arithmetic]
///   q  = clamp(round_half_to_even(x / scale) + zero_point, qmin, qmax)
///   x' = (q - zero_point) * scale
/// Division (not multiplication by 1/scale) and round-half-to-even are what ONNX Runtime's
/// QuantizeLinear does, so the simulation equals the deployed integer values bit for bit.
/// Symmetric: zero_point = 0, range [-2^(b-1), 2^(b-1)-1] ([-2^(b-1)+1, ...] when narrow),
///   scale = 2 * max|x| / (qmax - qmin)   (the original toolkit's definition).
/// Affine: range [0, 2^b - 1], scale = (max - min) / (qmax - qmin),
///   zero_point = clamp(round(qmin - min / scale), qmin, qmax).
/// The observed range is always widened to include 0 (so 0 is exactly representable, which
/// zero padding needs) and the scale is floored at kMinScale (a constant tensor quantizes
/// to a finite scale instead of NaN).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// Note [Per-group quantization]
/// With group_size G > 0 a weight is split into blocks of G consecutive elements along
/// group_axis (its input-channel axis); every block at every other index has its own scale, so
/// parameters have the weight's rank with dimension ceil(n / G) on group_axis (ONNX's blocked
/// quantization, DequantizeLinear opset 21 with block_size = G).
struct SPARSEBIT_API QSpec {
  int bits = 8;
  bool symmetric = true;
  bool per_channel = false;
  std::int64_t channel_axis = 0;  ///< used when per_channel
  std::int64_t group_size = 0;    ///< > 0: per group (Note [Per-group quantization])
  std::int64_t group_axis = 1;
  bool narrow_range = false;
  bool is_weight = false;
  /// Weights on the grid of `bits` (7) stored in bits + 1 (8): ONNX Runtime's reduce_range,
  /// which keeps u8 x s8 pair sums within 16 bits on x86 processors without VNNI
  /// (Note [u8s8 saturation]).
  bool reduce_range = false;

  std::int64_t qmin() const;
  std::int64_t qmax() const;
  /// "per-channel-symmetric" etc.; the config spelling.
  std::string qscheme() const;
  /// "int8 per-channel(axis 0) symmetric" for messages and reports.
  std::string describe() const;
};

inline constexpr double kMinScale = 1e-6;

/// Scale (float32) and zero point (int32 as float-free integer tensor). Per-tensor: 0-dim
/// tensors; per-channel: 1-D of the channel count.
struct QParams {
  at::Tensor scale;
  at::Tensor zero_point;
  bool defined() const { return scale.defined(); }
};

/// Scale and zero point from an observed range (tensors of equal shape; 0-dim per tensor).
/// Non-finite bounds are an Error naming `where`.
SPARSEBIT_API QParams qparams_from_range(const at::Tensor& min, const at::Tensor& max, const QSpec& spec,
                                         const std::string& where);

/// Parameters shaped to broadcast against x: per-channel vectors along spec.channel_axis,
/// per-group parameters repeated over their blocks.
SPARSEBIT_API at::Tensor expand_param(const at::Tensor& param, const at::Tensor& x, const QSpec& spec);

/// x as rows of what one scale covers: [C, N] per channel, [blocks, G] per group (the last
/// block zero-padded), [1, numel] per tensor. group_shape() is the parameters' shape per group.
SPARSEBIT_API at::Tensor quant_rows(const at::Tensor& x, const QSpec& spec);
SPARSEBIT_API std::vector<std::int64_t> group_param_shape(const at::Tensor& x, const QSpec& spec);
/// Inverse of quant_rows for one value per row: parameters shaped for a tensor of `shape`
/// (0-dim per tensor, [C] per channel, group_param_shape per group).
SPARSEBIT_API at::Tensor rows_to_params(const at::Tensor& values, const std::vector<std::int64_t>& shape,
                                        const QSpec& spec);

/// Fake quantization per Note [Quantization arithmetic], broadcasting per-channel parameters
/// along spec.channel_axis. Gradients: straight-through inside the clamp range, zero outside
/// (the same as torch.fake_quantize_*).
SPARSEBIT_API at::Tensor fake_quantize(const at::Tensor& x, const QParams& p, const QSpec& spec);

/// The integer values q (int32) of Note [Quantization arithmetic]; export writes these.
SPARSEBIT_API at::Tensor quantize_to_int(const at::Tensor& x, const QParams& p, const QSpec& spec);

/// LSQ's simulation: v = clamp(x / s + zp, qmin, qmax), y = (round(v) - zp) * s with a
/// straight-through round; differentiable in x, scale and zero_point (parameter-shaped tensors
/// as QParams holds them, float). dy/ds = round(v) - zp - x/s inside the range, qmin - zp or
/// qmax - zp outside; dy/dzp = 0 inside, -s outside.
SPARSEBIT_API at::Tensor lsq_fake_quantize(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                                           const QSpec& spec);

/// AdaRound's soft rounding: h = clamp(sigmoid(v) * (zeta - gamma) + gamma, 0, 1),
/// y = (clamp(floor(x / s) + h + zp, qmin, qmax) - zp) * s; differentiable in v only.
SPARSEBIT_API at::Tensor soft_round_quantize(const at::Tensor& x, const at::Tensor& v, const QParams& p,
                                             const QSpec& spec, double zeta, double gamma);

/// Minimum and maximum of x over the elements each parameter covers (a ragged last group: its
/// real elements only), float32 and parameter-shaped (0-dim per tensor, [C] per channel,
/// group_param_shape per group); NaN where a covered element is NaN.
SPARSEBIT_API std::pair<at::Tensor, at::Tensor> range_per_param(const at::Tensor& x, const QSpec& spec);

/// Counts [C, bins] (int64, on rows' device) of floor((double(x) + range) / width) clamped to
/// [0, bins - 1], width = 2 range / bins, for rows [C, N]: one histogram update.
SPARSEBIT_API at::Tensor histogram_counts(const at::Tensor& rows, double range, std::int64_t bins);

}  // namespace sparsebit
