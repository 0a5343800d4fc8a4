#pragma once
/// \file
/// Device kernels for the quantization arithmetic of quant.h.
///
/// Note [Device kernels]
/// The arithmetic of quant.h (fake_quantize, quantize_to_int, lsq_fake_quantize,
/// soft_round_quantize, range_per_param, histogram_counts) has a reference implementation in
/// ATen ops that runs on any device. A plugin may register a QuantKernels for a device type
/// (Registrar::add_kernels); from then on those functions call it for tensors on that device
/// (float32, with parameters that fit the layout below) and the reference for everything else.
/// A kernel must give the reference's integers bit for bit (same float32 operations in the
/// same order, no fused multiply-add, round half to even); gradients may differ by float
/// summation order (lsq's, summed with atomics, also from run to run: with ATen's deterministic
/// algorithms switched on its reference runs instead). SPARSEBIT_KERNELS=0 in the environment (or
/// use_device_kernels(false)) switches every registered kernel off, which is how the two paths are compared.
///
/// Note [Parameter layout]
/// x (contiguous) is viewed as [outer, n, inner] around the quantization axis; the parameter
/// of an element (o, k, i) is at index
///   per tensor:  0
///   per channel: k                                  (n = channels)
///   per group:   (o * ceil(n / G) + k / G) * inner + i   (the order of group_param_shape)

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

struct QSpec;

struct ParamLayout {
  enum class Kind { kTensor, kChannel, kGroup };
  Kind kind = Kind::kTensor;
  std::int64_t outer = 1, n = 1, inner = 1;
  std::int64_t group = 0;  ///< G, per group only
  std::int64_t params() const {
    switch (kind) {
      case Kind::kTensor: return 1;
      case Kind::kChannel: return n;
      case Kind::kGroup: return outer * ((n + group - 1) / group) * inner;
    }
    return 1;
  }
};

/// The layout of x's parameters under spec (Note [Parameter layout]); an Error if the axis does
/// not exist in x.
SPARSEBIT_API ParamLayout param_layout(const at::Tensor& x, const QSpec& spec);

/// Arguments shared by the element-wise kernels: x is float32 and contiguous; scale and
/// zero_point are float32, contiguous, on x's device, with layout.params() elements.
struct QuantArgs {
  at::Tensor x, scale, zero_point;
  ParamLayout layout;
  std::int64_t qmin = 0, qmax = 0;
};

class QuantKernels {
 public:
  virtual ~QuantKernels() = default;
  /// Shown in logs and `sparsebit plugins`.
  virtual std::string describe() const = 0;

  /// (clamp(round(x / s) + zp, qmin, qmax) - zp) * s
  virtual at::Tensor fake_quantize(const QuantArgs& a) = 0;
  /// grad where qmin <= round(x / s) + zp <= qmax, else 0 (straight-through).
  virtual at::Tensor fake_quantize_backward(const at::Tensor& grad, const QuantArgs& a) = 0;
  /// clamp(round(x / s) + zp, qmin, qmax) as int32 (through int64, as the reference).
  virtual at::Tensor quantize_to_int(const QuantArgs& a) = 0;

  /// LSQ: v = clamp(x / s + zp, qmin, qmax), y = (round(v) - zp) * s.
  virtual at::Tensor lsq_forward(const QuantArgs& a) = 0;
  /// Gradients of lsq_forward: {grad_x [x's shape], grad_scale [params], grad_zero_point
  /// [params]}, the parameter gradients summed over the elements each parameter covers.
  virtual std::tuple<at::Tensor, at::Tensor, at::Tensor> lsq_backward(const at::Tensor& grad, const QuantArgs& a) = 0;

  /// AdaRound's soft rounding of x with rounding variables v (x's shape):
  /// h = clamp(sigmoid(v) * (zeta - gamma) + gamma, 0, 1),
  /// y = (clamp(floor(x / s) + h + zp, qmin, qmax) - zp) * s.
  virtual at::Tensor soft_round_forward(const QuantArgs& a, const at::Tensor& v, double zeta, double gamma) = 0;
  /// dL/dv of soft_round_forward.
  virtual at::Tensor soft_round_backward(const at::Tensor& grad, const QuantArgs& a, const at::Tensor& v, double zeta,
                                         double gamma) = 0;

  /// Per-parameter minimum and maximum of x (float32 [layout.params()] each; NaN if a covered
  /// element is NaN).
  virtual std::pair<at::Tensor, at::Tensor> range_per_param(const at::Tensor& x, const ParamLayout& layout) = 0;
  /// rows [C, N] float32: int64 counts [C, bins] of floor((double(x) + range) / width), width =
  /// 2 range / bins, clamped to [0, bins - 1].
  virtual at::Tensor histogram_counts(const at::Tensor& rows, double range, std::int64_t bins) = 0;
};

/// Note [MatMulNBits kernels]
/// A QuantKernels may also derive from MatMulNBitsKernels (a capability, SDK 1.2): then the
/// MatMulNBits op (ONNX Runtime's com.microsoft contrib op, Note [MatMulNBits] in the quantization
/// ops plugin) runs on that device through it instead of dequantizing every weight to float with
/// ATen ops on each call. The arguments are as the op receives them; matmul_nbits returns an
/// undefined tensor for what it does not take (other bit widths, g_idx, zero points in A's type),
/// and the op then runs its reference.
struct MatMulNBitsArgs {
  at::Tensor a;            ///< [M, K], float32 or float16
  at::Tensor b;            ///< uint8 [N, k_blocks, block_size * bits / 8], codes low bits first
  at::Tensor scales;       ///< [N * k_blocks] in a's type
  at::Tensor zero_points;  ///< uint8 packed like b ([N, ceil(k_blocks * bits / 8)]) or undefined (2^(bits-1))
  std::int64_t k = 0, n = 0, bits = 4, block_size = 0;
};

class MatMulNBitsKernels {
 public:
  virtual ~MatMulNBitsKernels() = default;
  /// Y [M, N] = A W^T in a's type, W[n, k] = (code - zero point) * scale of k's block.
  virtual at::Tensor matmul_nbits(const MatMulNBitsArgs& args) = 0;
};

/// The MatMulNBits kernels of the QuantKernels registered for a device type, or nullptr (none,
/// switched off, or kernels without the capability).
SPARSEBIT_API MatMulNBitsKernels* matmul_nbits_kernels(c10::DeviceType device);

/// The kernels registered for a device type, or nullptr (none, or switched off).
SPARSEBIT_API QuantKernels* quant_kernels(c10::DeviceType device);
/// Switches registered kernels on or off process-wide (on by default unless SPARSEBIT_KERNELS=0).
SPARSEBIT_API void use_device_kernels(bool on);
/// Installs kernels for a device, replacing earlier ones (the registry does this when it commits
/// a plugin's kernels; several registries in one process load the same plugin); nullptr removes
/// them. Kernels stay installed after their registry is gone (plugins are never unloaded).
SPARSEBIT_API void install_quant_kernels(c10::DeviceType device, std::shared_ptr<QuantKernels> kernels,
                                         const std::string& plugin);

}  // namespace sparsebit
