// The CUDA kernels plugin: registers QuantKernels for CUDA tensors (Note [Device kernels] in
// sparsebit/sdk/kernels.h), so fake quantization, its straight-through and LSQ gradients,
// AdaRound's soft rounding and the observers' min/max and histogram updates run as single
// kernels (quant_kernels.cu, quant_reductions.cu) instead of chains of ATen operators; and, as MatMulNBitsKernels,
// the 4-bit weight products of MatMulNBits (matmul_nbits.cu).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cuda_runtime_api.h>

#include <limits>

#include "matmul_nbits.h"
#include "quant_kernels.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

cuda::Layout layout_of(const ParamLayout& l) {
  cuda::Layout c;
  c.kind = l.kind == ParamLayout::Kind::kTensor    ? cuda::Layout::kTensor
           : l.kind == ParamLayout::Kind::kChannel ? cuda::Layout::kChannel
                                                   : cuda::Layout::kGroup;
  c.outer = l.outer;
  c.n = l.n;
  c.inner = l.inner;
  c.group = l.group > 0 ? l.group : 1;
  return c;
}

// What every kernel needs from QuantArgs, checked: the host promises float32 contiguous tensors
// on one device; a plugin says so loudly rather than reading wrong memory if that ever breaks.
cuda::QuantPtrs ptrs_of(const QuantArgs& a) {
  auto require = [&](const at::Tensor& t, const char* name, std::int64_t numel) {
    if (!t.is_cuda() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.numel() != numel ||
        t.device() != a.x.device())
      throw Error(std::string("cuda kernels: ") + name + " must be a contiguous float32 tensor of " +
                  std::to_string(numel) + " elements on " + a.x.device().str() + ", got " + t.toString() + " " +
                  c10::str(t.sizes()) + " on " + t.device().str());
  };
  require(a.x, "x", a.x.numel());
  require(a.scale, "scale", a.layout.params());
  require(a.zero_point, "zero_point", a.layout.params());
  return {a.x.data_ptr<float>(),
          a.scale.data_ptr<float>(),
          a.zero_point.data_ptr<float>(),
          a.x.numel(),
          layout_of(a.layout),
          a.qmin,
          a.qmax};
}

at::Tensor same_shape_float(const at::Tensor& t, const at::Tensor& x, const char* name) {
  if (t.sizes() != x.sizes())
    throw Error(std::string("cuda kernels: ") + name + " has shape " + c10::str(t.sizes()) + ", x has " +
                c10::str(x.sizes()));
  return t.to(x.device(), at::kFloat).contiguous();
}

cudaStream_t stream_of(const at::Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }

class CudaQuantKernels final : public QuantKernels, public MatMulNBitsKernels {
 public:
  std::string describe() const override {
    return "fused fake-quant, LSQ, soft rounding, min/max and histogram kernels; 4-bit MatMulNBits";
  }

  // Note [MatMulNBits kernels]: 4-bit codes, zero points packed or absent, float32 or float16
  // activations with scales of the same type; up to 8 rows (16 in float16 on tensor cores) by
  // the decode kernels, more by one dequantization and a cuBLAS product.
  at::Tensor matmul_nbits(const MatMulNBitsArgs& args) override {
    const at::ScalarType type = args.a.scalar_type();
    const at::Device device = args.a.device();
    auto on_device = [&](const at::Tensor& t) { return t.device() == device && t.is_contiguous(); };
    // What the kernels do not take goes to the reference, which also names what is wrong.
    if (args.bits != 4 || !args.a.is_cuda() || (type != at::kFloat && type != at::kHalf) ||
        args.scales.scalar_type() != type || args.block_size < 16 || (args.block_size & (args.block_size - 1)) != 0 ||
        args.k >= (std::int64_t{1} << 31) || !on_device(args.b) || !on_device(args.scales) ||
        (args.zero_points.defined() && (args.zero_points.scalar_type() != at::kByte || !on_device(args.zero_points))))
      return {};
    const std::int64_t blocks = (args.k + args.block_size - 1) / args.block_size;
    if (args.b.numel() != args.n * blocks * args.block_size / 2 || args.scales.numel() != args.n * blocks ||
        (args.zero_points.defined() && args.zero_points.numel() != args.n * ((blocks + 1) / 2)))
      return {};
    const c10::cuda::CUDAGuard guard(device);
    const at::Tensor x =
        args.a.is_contiguous() && args.a.dim() == 2 ? args.a : args.a.reshape({-1, args.k}).contiguous();
    const cuda::Nbits4Weight w{
        static_cast<const std::uint8_t*>(args.b.data_ptr()),
        args.scales.data_ptr(),
        args.zero_points.defined() ? static_cast<const std::uint8_t*>(args.zero_points.data_ptr()) : nullptr,
        args.n,
        args.k,
        args.block_size};
    const std::int64_t m = x.size(0);
    if (m == 0) return at::empty({0, args.n}, x.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    if (cuda::gemv_nbits4_supported(w, x.data_ptr(), m, type == at::kHalf)) {
      at::Tensor y = at::empty({m, args.n}, x.options());
      cuda::gemv_nbits4(w, x.data_ptr(), m, type == at::kHalf, y.data_ptr(), stream);
      return y;
    }
    at::Tensor weight = at::empty({args.n, args.k}, x.options());
    cuda::dequantize_nbits4(w, type == at::kHalf, weight.data_ptr(), stream);
    return at::matmul(x, weight.t());
  }

  at::Tensor fake_quantize(const QuantArgs& a) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    at::Tensor y = at::empty_like(a.x);
    cuda::fake_quantize(p, y.data_ptr<float>(), stream_of(a.x));
    return y;
  }

  at::Tensor fake_quantize_backward(const at::Tensor& grad, const QuantArgs& a) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    const at::Tensor g = same_shape_float(grad, a.x, "grad");
    at::Tensor gx = at::empty_like(a.x);
    cuda::fake_quantize_backward(p, g.data_ptr<float>(), gx.data_ptr<float>(), stream_of(a.x));
    return gx;
  }

  at::Tensor quantize_to_int(const QuantArgs& a) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    at::Tensor q = at::empty(a.x.sizes(), a.x.options().dtype(at::kInt));
    cuda::quantize_to_int(p, q.data_ptr<std::int32_t>(), stream_of(a.x));
    return q;
  }

  at::Tensor lsq_forward(const QuantArgs& a) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    at::Tensor y = at::empty_like(a.x);
    cuda::lsq_forward(p, y.data_ptr<float>(), stream_of(a.x));
    return y;
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor> lsq_backward(const at::Tensor& grad, const QuantArgs& a) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    const at::Tensor g = same_shape_float(grad, a.x, "grad");
    at::Tensor gx = at::empty_like(a.x);
    at::Tensor gs = at::zeros({a.layout.params()}, a.x.options());
    at::Tensor gz = at::zeros({a.layout.params()}, a.x.options());
    cuda::lsq_backward(p, g.data_ptr<float>(), gx.data_ptr<float>(), gs.data_ptr<float>(), gz.data_ptr<float>(),
                       stream_of(a.x));
    return {gx, gs, gz};
  }

  at::Tensor soft_round_forward(const QuantArgs& a, const at::Tensor& v, double zeta, double gamma) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    const at::Tensor vc = same_shape_float(v, a.x, "v");
    at::Tensor y = at::empty_like(a.x);
    cuda::soft_round_forward(p, vc.data_ptr<float>(), float(zeta), float(gamma), y.data_ptr<float>(), stream_of(a.x));
    return y;
  }

  at::Tensor soft_round_backward(const at::Tensor& grad, const QuantArgs& a, const at::Tensor& v, double zeta,
                                 double gamma) override {
    const c10::cuda::CUDAGuard guard(a.x.device());
    const cuda::QuantPtrs p = ptrs_of(a);
    const at::Tensor vc = same_shape_float(v, a.x, "v");
    const at::Tensor g = same_shape_float(grad, a.x, "grad");
    at::Tensor gv = at::empty_like(a.x);
    cuda::soft_round_backward(p, vc.data_ptr<float>(), float(zeta), float(gamma), g.data_ptr<float>(),
                              gv.data_ptr<float>(), stream_of(a.x));
    return gv;
  }

  std::pair<at::Tensor, at::Tensor> range_per_param(const at::Tensor& x_in, const ParamLayout& layout) override {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const at::Tensor x = x_in.to(at::kFloat).contiguous();
    const std::int64_t n = layout.params();
    at::Tensor lo = at::empty({n}, x.options());
    at::Tensor hi = at::empty({n}, x.options());
    cuda::range_per_param(x.data_ptr<float>(), x.numel(), layout_of(layout), lo.data_ptr<float>(), hi.data_ptr<float>(),
                          stream_of(x));
    return {lo, hi};
  }

  at::Tensor histogram_counts(const at::Tensor& rows_in, double range, std::int64_t bins) override {
    const c10::cuda::CUDAGuard guard(rows_in.device());
    const at::Tensor rows = rows_in.to(at::kFloat).contiguous();
    at::Tensor counts = at::zeros({rows.size(0), bins}, rows.options().dtype(at::kLong));
    static_assert(sizeof(unsigned long long) == sizeof(std::int64_t), "64-bit counters");
    cuda::histogram(rows.data_ptr<float>(), rows.size(0), rows.size(1), range, bins,
                    reinterpret_cast<unsigned long long*>(counts.data_ptr<std::int64_t>()), stream_of(rows));
    return counts;
  }
};

void register_all(Registrar& r) { r.add_kernels<CudaQuantKernels>(c10::DeviceType::CUDA); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.cuda", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
