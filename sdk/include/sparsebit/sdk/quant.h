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

/// Note [Float8 elements]
/// A tensor may be rounded to an 8-bit float instead of an integer grid (SDK 1.2): E4M3 (4
/// exponent bits, bias 7, 3 mantissa bits, no infinities, largest 448: ONNX's FLOAT8E4M3FN and
/// torch.float8_e4m3fn) or E5M2 (bias 15, 2 mantissa bits, largest 57344: FLOAT8E5M2).
///   x' = round_to_float8(x / scale) * scale,  scale = amax / largest,  zero_point = 0
/// round_to_float8 saturates to +-largest (infinities too) and rounds to nearest, ties to even:
/// what ONNX's QuantizeLinear with saturate = 1 computes (ONNX Runtime's CPU kernels agree bit for
/// bit), and a cast to torch.float8_e4m3fn / float8_e5m2 after clamping to +-largest. Such a QSpec
/// is symmetric with qmin() = -largest and qmax() = largest; qparams_from_range divides amax by
/// the largest value. fake_quantize's gradient is straight-through inside +-largest. Only observers and quantizers that
/// derive from HandlesFloat8Elements are given such specs, and only backends deriving from DeploysFloat8 (backend.h)
/// deploy them: a plugin built before 1.2 never sees one. `element` sits in what was QSpec's tail padding, so the
/// struct keeps its size and every field its offset.
enum class QElement : std::uint8_t { kInt = 0, kFloat8E4M3FN = 1, kFloat8E5M2 = 2 };

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
  QElement element = QElement::kInt;  ///< Note [Float8 elements]

  bool is_float8() const { return element != QElement::kInt; }
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

/// The integer values q (int32) of Note [Quantization arithmetic]; export writes these. An
/// Error for a float8 spec (quantize_to_float8).
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

/// The largest finite value of a float8 element (448, 57344); an Error for kInt.
SPARSEBIT_API double float8_max(QElement element);
/// "fp8_e4m3", "fp8_e5m2" or "int": the config spelling.
SPARSEBIT_API std::string element_name(QElement element);

/// v rounded to the nearest value of `element` (ties to even), saturating at +-float8_max
/// (infinities included); NaN stays NaN. Float32 out, on v's device (Note [Float8 elements]).
SPARSEBIT_API at::Tensor round_to_float8(const at::Tensor& v, QElement element);

/// The float8 codes (uint8 bit patterns, sign in bit 7) of round_to_float8(x / scale): what export
/// stores for a float8 weight, decoding to exactly what fake_quantize simulates.
SPARSEBIT_API at::Tensor quantize_to_float8(const at::Tensor& x, const QParams& p, const QSpec& spec);

/// The value of each float8 code (uint8 tensor) of `element`, float32.
SPARSEBIT_API at::Tensor decode_float8(const at::Tensor& codes, QElement element);

/// A quantizer or observer that computes correctly on float8 specs derives from this as well
/// (Note [Capabilities] in quantizer.h); the host gives a float8 spec to no other.
class HandlesFloat8Elements {
 public:
  virtual ~HandlesFloat8Elements() = default;
};

}  // namespace sparsebit
