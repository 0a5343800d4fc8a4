// CUDA kernels for the element-wise quantization arithmetic of sparsebit/sdk/quant.h: fake
// quantization and its straight-through gradient, integers, LSQ's forward, AdaRound's soft
// rounding (bit-exact with the CPU: quant_kernels_common.cuh).
//
// One driver (map_kernel) with an operation each: two items of 4 consecutive floats per thread
// per step (16-byte vectors when every pointer is aligned) in a grid-stride loop.

#include "quant_kernels_common.cuh"

namespace sparsebit::cuda {
namespace {

// --- element-wise kernels -------------------------------------------------------------------

// One driver for every element-wise kernel: each thread takes two items of kVec consecutive
// elements per step, issues all their loads before any arithmetic (the division chain would
// otherwise leave one 16-byte load in flight per thread), and writes op(values, s, zp) per
// element, values being the element's kIn inputs.
template <int kIn>
struct Inputs {
  const float* p[kIn];
};

template <bool kAligned, typename I, int kIn, typename Out, class Op>
__device__ __forceinline__ void map_item(const float (&v)[kIn][kVec], I e, I numel, const ParamIndex<I>& pidx,
                                         const Params& P, const Op& op, Out* __restrict__ out) {
  I ps[kVec];
  pidx.item(e, numel, ps);
  Out o[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float a[kIn];
#pragma unroll
    for (int k = 0; k < kIn; ++k) a[k] = v[k][j];
    o[j] = op(a, __ldg(P.scale + ps[j]), __ldg(P.zero_point + ps[j]), P);
  }
  store4<kAligned>(out, e, numel, o);
}

template <bool kAligned, typename I, int kIn, typename Out, class Op>
__global__ void map_kernel(Inputs<kIn> in, Out* __restrict__ out, I numel, ParamIndex<I> pidx, Params P, Op op) {
  const I stride = I(gridDim.x) * blockDim.x * kVec * 2;
  for (I e0 = (I(blockIdx.x) * blockDim.x * 2 + threadIdx.x) * kVec; e0 < numel; e0 += stride) {
    const I e1 = e0 + I(blockDim.x) * kVec;
    float v0[kIn][kVec], v1[kIn][kVec];
#pragma unroll
    for (int k = 0; k < kIn; ++k) {
      load4<kAligned>(in.p[k], e0, numel, v0[k]);
      if (e1 < numel) load4<kAligned>(in.p[k], e1, numel, v1[k]);
    }
    map_item<kAligned>(v0, e0, numel, pidx, P, op, out);
    if (e1 < numel) map_item<kAligned>(v1, e1, numel, pidx, P, op, out);
  }
}

// (clamp(round(x / s) + zp) - zp) * s
struct FakeQuantizeOp {
  __device__ float operator()(const float (&a)[1], float s, float zp, const Params& P) const {
    const float q = clampf(__fadd_rn(rintf(__fdiv_rn(a[0], s)), zp), P.qmin, P.qmax);
    return __fmul_rn(__fsub_rn(q, zp), s);
  }
};

// {x, grad}: grad where round(x / s) + zp is inside the range.
struct StraightThroughOp {
  __device__ float operator()(const float (&a)[2], float s, float zp, const Params& P) const {
    const float q = __fadd_rn(rintf(__fdiv_rn(a[0], s)), zp);
    return (q >= P.qmin && q <= P.qmax) ? a[1] : 0.0f;
  }
};

struct ToIntOp {
  long long qmin, qmax;
  __device__ std::int32_t operator()(const float (&a)[1], float s, float zp, const Params&) const {
    const float f = __fadd_rn(rintf(__fdiv_rn(a[0], s)), zp);
    // Through int64 as the reference: float32 cannot hold the int32 bounds of 32-bit ranges.
    long long i = isnan(f) ? qmin : __float2ll_rz(f);
    i = i < qmin ? qmin : (i > qmax ? qmax : i);
    return std::int32_t(i);
  }
};

// LSQ: (round(clamp(x / s + zp)) - zp) * s
struct LsqForwardOp {
  __device__ float operator()(const float (&a)[1], float s, float zp, const Params& P) const {
    const float c = clampf(__fadd_rn(__fdiv_rn(a[0], s), zp), P.qmin, P.qmax);
    return __fmul_rn(__fsub_rn(rintf(c), zp), s);
  }
};

// --- AdaRound soft rounding -------------------------------------------------------------------

struct Soft {
  float zeta_minus_gamma, gamma;
};

__device__ __forceinline__ float sigmoid(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v))); }

// {x, v}: (clamp(floor(x / s) + h(v) + zp) - zp) * s
struct SoftRoundOp {
  Soft r;
  __device__ float operator()(const float (&a)[2], float s, float zp, const Params& P) const {
    const float h = clampf(__fadd_rn(__fmul_rn(sigmoid(a[1]), r.zeta_minus_gamma), r.gamma), 0.0f, 1.0f);
    const float q = clampf(__fadd_rn(__fadd_rn(floorf(__fdiv_rn(a[0], s)), h), zp), P.qmin, P.qmax);
    return __fmul_rn(__fsub_rn(q, zp), s);
  }
};

// {x, v, grad}: dL/dv, in the reference's order: * s (scale), * (zeta - gamma), sigmoid'.
struct SoftRoundBackwardOp {
  Soft r;
  __device__ float operator()(const float (&a)[3], float s, float zp, const Params& P) const {
    const float sig = sigmoid(a[1]);
    const float pre = __fadd_rn(__fmul_rn(sig, r.zeta_minus_gamma), r.gamma);
    const float q = __fadd_rn(__fadd_rn(floorf(__fdiv_rn(a[0], s)), clampf(pre, 0.0f, 1.0f)), zp);
    const bool pass = pre >= 0.0f && pre <= 1.0f && q >= P.qmin && q <= P.qmax;
    return pass ? __fmul_rn(__fmul_rn(__fmul_rn(a[2], s), r.zeta_minus_gamma), __fmul_rn(__fsub_rn(1.0f, sig), sig))
                : 0.0f;
  }
};

// --- launch ------------------------------------------------------------------------------------

// Launches map_kernel for op over the inputs (each of a.numel floats) into out.
template <int kIn, typename Out, class Op>
void map(const char* name, const Inputs<kIn>& in, Out* out, const QuantPtrs& a, Op op, cudaStream_t stream) {
  if (a.numel == 0) return;
  bool all_aligned = aligned(out);
  for (int k = 0; k < kIn; ++k) all_aligned = all_aligned && aligned(in.p[k]);
  dispatch(a.numel, all_aligned, [&](auto al, auto index) {
    using I = decltype(index);
    map_kernel<decltype(al)::value, I, kIn, Out, Op><<<blocks_for((a.numel + 1) / 2), kThreads, 0, stream>>>(
        in, out, I(a.numel), ParamIndex<I>(a.layout), params_of(a), op);
  });
  check_launch(name);
}

}  // namespace

void fake_quantize(const QuantPtrs& a, float* y, cudaStream_t stream) {
  map<1>("fake_quantize", {a.x}, y, a, FakeQuantizeOp{}, stream);
}

void fake_quantize_backward(const QuantPtrs& a, const float* grad, float* grad_x, cudaStream_t stream) {
  map<2>("fake_quantize_backward", {a.x, grad}, grad_x, a, StraightThroughOp{}, stream);
}

void quantize_to_int(const QuantPtrs& a, std::int32_t* q, cudaStream_t stream) {
  map<1>("quantize_to_int", {a.x}, q, a, ToIntOp{(long long)a.qmin, (long long)a.qmax}, stream);
}

void lsq_forward(const QuantPtrs& a, float* y, cudaStream_t stream) {
  map<1>("lsq_forward", {a.x}, y, a, LsqForwardOp{}, stream);
}

void soft_round_forward(const QuantPtrs& a, const float* v, float zeta, float gamma, float* y, cudaStream_t stream) {
  map<2>("soft_round_forward", {a.x, v}, y, a, SoftRoundOp{{zeta - gamma, gamma}}, stream);
}

void soft_round_backward(const QuantPtrs& a, const float* v, float zeta, float gamma, const float* grad, float* grad_v,
                         cudaStream_t stream) {
  map<3>("soft_round_backward", {a.x, v, grad}, grad_v, a, SoftRoundBackwardOp{{zeta - gamma, gamma}}, stream);
}

}  // namespace sparsebit::cuda
