#pragma once
// Helpers shared by the op plugins of this repository (not part of the SDK): spatial attribute
// parsing for Conv/pooling and ONNX padding rules.

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/op.h"

namespace sparsebit::ops {

/// kernel_shape / strides / dilations / pads / auto_pad of a Conv-like or pooling node.
struct Window {
  std::vector<std::int64_t> kernel;  // may be empty for Conv (taken from the weight)
  std::vector<std::int64_t> strides;
  std::vector<std::int64_t> dilations;
  std::vector<std::int64_t> pads;  // [begin..., end...]; empty = all zero
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;

  explicit Window(const Node& n) {
    kernel = n.attr_ints("kernel_shape");
    strides = n.attr_ints("strides");
    dilations = n.attr_ints("dilations");
    pads = n.attr_ints("pads");
    auto_pad = n.attr_string("auto_pad", "NOTSET");
    ceil_mode = n.attr_int("ceil_mode", 0) != 0;
    if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
      throw Error(n.describe() + ": auto_pad '" + auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  }

  /// Fills defaults for `spatial` dims and resolves auto_pad against the input's spatial sizes.
  /// Returns pads as [begin..., end...].
  std::vector<std::int64_t> resolve(const std::vector<std::int64_t>& in, const std::vector<std::int64_t>& k) {
    const std::size_t r = in.size();
    if (strides.empty()) strides.assign(r, 1);
    if (dilations.empty()) dilations.assign(r, 1);
    std::vector<std::int64_t> p = pads.empty() ? std::vector<std::int64_t>(2 * r, 0) : pads;
    if (auto_pad == "VALID") {
      p.assign(2 * r, 0);
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      for (std::size_t i = 0; i < r; ++i) {
        std::int64_t out = (in[i] + strides[i] - 1) / strides[i];
        std::int64_t total = std::max<std::int64_t>(0, (out - 1) * strides[i] + (k[i] - 1) * dilations[i] + 1 - in[i]);
        std::int64_t small = total / 2, big = total - small;
        p[i] = auto_pad == "SAME_UPPER" ? small : big;
        p[i + r] = auto_pad == "SAME_UPPER" ? big : small;
      }
    }
    return p;
  }
};

inline std::vector<std::int64_t> spatial_sizes(const at::Tensor& x) {
  return std::vector<std::int64_t>(x.sizes().begin() + 2, x.sizes().end());
}

inline bool symmetric(const std::vector<std::int64_t>& pads) {
  const std::size_t r = pads.size() / 2;
  for (std::size_t i = 0; i < r; ++i)
    if (pads[i] != pads[i + r]) return false;
  return true;
}

/// Pads the spatial dims of x (N, C, spatial...) with `value`; pads = [begin..., end...].
inline at::Tensor pad_spatial(const at::Tensor& x, const std::vector<std::int64_t>& pads, double value) {
  const std::size_t r = pads.size() / 2;
  std::vector<std::int64_t> torch_pads;  // last dim first: [begin, end, ...]
  for (std::size_t i = r; i-- > 0;) {
    torch_pads.push_back(pads[i]);
    torch_pads.push_back(pads[i + r]);
  }
  return at::constant_pad_nd(x, torch_pads, value);
}

/// Note [Channels-last on GPUs]
/// cuDNN's channels-last convolutions pay off on GPUs with TensorFloat-32 and lose in full FP32
/// (H200, QAT step at batch 64, docs/GPU.md: resnet18 TF32 21.2 -> 18.6 ms, FP32 36.5 -> 40.4
/// ms; resnet50 TF32 50.0 -> 47.8, FP32 107.0 -> 114.7), so they follow cuDNN's TF32 switch
/// ([qat] tf32 while training). SPARSEBIT_GPU_CHANNELS_LAST=1 or 0 forces them on or off.
inline bool gpu_channels_last() {
  static const int forced = [] {
    const char* v = std::getenv("SPARSEBIT_GPU_CHANNELS_LAST");
    return v && std::string(v) == "1" ? 1 : v && std::string(v) == "0" ? 0 : -1;
  }();
  return forced >= 0 ? forced == 1 : at::globalContext().allowTF32CuDNN();
}

/// ONNX Conv on ATen (any float type): resolves auto_pad against the input and pads asymmetric
/// cases explicitly, which ATen's symmetric padding cannot express.
inline at::Tensor onnx_conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Window win,
                            std::int64_t group, const Node& n) {
  if (x.dim() < 3 || w.dim() != x.dim())
    throw Error(n.describe() + ": input of rank " + std::to_string(x.dim()) + " and weight of rank " +
                std::to_string(w.dim()) + " do not fit (expected N,C,spatial... and M,C/group,k...)");
  std::vector<std::int64_t> k(w.sizes().begin() + 2, w.sizes().end());
  auto pads = win.resolve(spatial_sizes(x), k);
  at::Tensor input = x;
  std::vector<std::int64_t> padding(k.size(), 0);
  if (symmetric(pads)) padding.assign(pads.begin(), pads.begin() + static_cast<long>(k.size()));
  else input = pad_spatial(x, pads, 0.0);
  if (input.dim() == 4 && input.scalar_type() == at::kFloat &&
      (input.device().is_cpu() || (input.device().is_cuda() && gpu_channels_last()))) {
    // Note [Channels-last convolutions]: oneDNN runs 2-D convolutions on channels-last data
    // about twice as fast (MobileNetV2, batch 32, 2 threads: 1.00 s -> 0.49 s; depthwise 1x64x16x50
    // 0.125 -> 0.029 ms), so the result stays channels-last: the element-wise ops, pools and
    // convolutions after it keep that layout, and the executor hands graph outputs back
    // contiguous. On GPUs only with TensorFloat-32 (Note [Channels-last on GPUs]).
    const auto cl = at::MemoryFormat::ChannelsLast;
    return at::convolution(input.contiguous(cl), w.contiguous(cl), b, win.strides, padding, win.dilations, false,
                           std::vector<std::int64_t>(k.size(), 0), group);
  }
  return at::convolution(input, w, b, win.strides, padding, win.dilations, false,
                         std::vector<std::int64_t>(k.size(), 0), group);
}

/// `specs` with inputs `which` marked as read on the host (InputSpec::host): a model on a GPU
/// then gives them as host copies when they are constants (no device read per run).
inline std::vector<sparsebit::InputSpec> reading_on_host(std::vector<sparsebit::InputSpec> specs,
                                                         std::initializer_list<std::size_t> which) {
  for (const std::size_t i : which) {
    if (specs.size() <= i) specs.resize(i + 1);
    specs[i].host = true;
  }
  return specs;
}

/// Values of a small integer tensor (axes, shapes, K, ...) read on the host.
inline std::vector<std::int64_t> int_list(const at::Tensor& t, const Node& n, const char* what) {
  if (t.is_floating_point() || t.is_complex())
    throw Error(n.describe() + ": " + what + " must be an integer tensor, got " +
                std::string(c10::toString(t.scalar_type())));
  at::Tensor v = t.to(at::kCPU, at::kLong).contiguous().reshape({-1});
  return std::vector<std::int64_t>(v.data_ptr<std::int64_t>(), v.data_ptr<std::int64_t>() + v.numel());
}

/// ATen type of an ONNX TensorProto element type number (the `to` of Cast, ...).
inline at::ScalarType scalar_type_of(std::int64_t onnx_type, const Node& n) {
  switch (onnx_type) {
    case 1: return at::kFloat;
    case 2: return at::kByte;
    case 3: return at::kChar;
    case 5: return at::kShort;
    case 6: return at::kInt;
    case 7: return at::kLong;
    case 9: return at::kBool;
    case 10: return at::kHalf;
    case 11: return at::kDouble;
    case 16: return at::kBFloat16;
    default:
      throw Error(n.describe() + ": element type " + std::to_string(onnx_type) +
                  " is not supported (float, double, float16, bfloat16, int8/16/32/64, uint8, bool are)");
  }
}

inline std::int64_t normalize_axis(std::int64_t axis, std::int64_t rank, const Node& n) {
  if (axis < -rank || axis >= std::max<std::int64_t>(rank, 1))
    throw Error(n.describe() + ": axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

/// A normalization's result over `dims`: y = (x - mean) / sqrt(mean square + eps), with the
/// biased variance every ONNX norm uses; `rms` (ONNX Runtime's simplified norms) skips the
/// centring and leaves mean undefined.
struct Normalized {
  at::Tensor y, mean, inv_std;
};
inline Normalized normalize(const at::Tensor& x, const std::vector<std::int64_t>& dims, double eps, bool rms = false) {
  Normalized r;
  if (!rms) r.mean = x.mean(dims, /*keepdim=*/true);
  const at::Tensor centered = rms ? x : x - r.mean;
  r.inv_std = at::rsqrt((centered * centered).mean(dims, /*keepdim=*/true) + eps);
  r.y = centered * r.inv_std;
  return r;
}

/// The axes from `axis` to the last of a rank-`rank` tensor (what LayerNormalization normalizes).
inline std::vector<std::int64_t> axes_from(std::int64_t axis, std::int64_t rank, const Node& n) {
  std::vector<std::int64_t> dims;
  for (std::int64_t d = normalize_axis(axis, rank, n); d < rank; ++d) dims.push_back(d);
  return dims;
}

}  // namespace sparsebit::ops
