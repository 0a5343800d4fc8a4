#pragma once
// What the CUDA kernels of quant_kernels.cu (element-wise) and quant_reductions.cu (reductions
// to per-parameter values, observers) share: launch sizes, the parameter index of each element,
// 16-byte loads and stores, and the run-time choice of alignment and index type.
//
// Bit-exactness: every float operation the reference (ATen) performs is done with the same
// IEEE-rounded intrinsic in the same order (__fdiv_rn, __fadd_rn, __fmul_rn; rintf is round half
// to even), and nothing is contracted into a fused multiply-add (also --fmad=false), so the
// quantized integers equal the CPU's for every finite input.

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "quant_kernels.h"

namespace sparsebit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;

inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

inline int multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0)
    return 80;
  return count;
}

// Blocks for `items` work items of kVec elements: enough to fill every multiprocessor several
// times, no more (the grid-stride loop covers the rest).
inline unsigned blocks_for(std::int64_t numel) {
  const std::int64_t items = (numel + kVec - 1) / kVec;
  const std::int64_t wanted = (items + kThreads - 1) / kThreads;
  const std::int64_t cap = std::int64_t(multiprocessors()) * 16;
  return unsigned(wanted < 1 ? 1 : wanted > cap ? cap : wanted);
}

// Reductions use fewer, longer-lived warps: each ends with atomics per parameter run, which for
// a per-tensor reduction all hit one address.
inline unsigned reduction_blocks(std::int64_t numel) {
  const std::int64_t cap = std::int64_t(multiprocessors()) * 8;
  const std::int64_t wanted = blocks_for(numel);
  return unsigned(wanted < cap ? wanted : cap);
}

// Division by a runtime constant. 32-bit: multiply-high and shift (Granlund & Montgomery), valid
// for dividends below 2^31, which is when the 32-bit kernels are used.
template <typename I>
struct Divider;
template <>
struct Divider<std::uint32_t> {
  std::uint32_t d = 1, m = 1, s = 0;
  Divider() = default;
  explicit Divider(std::uint32_t divisor) : d(divisor) {
    while ((std::uint64_t{1} << s) < d) ++s;
    m = std::uint32_t(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << s) - d)) / d + 1);
  }
  __device__ __forceinline__ std::uint32_t div(std::uint32_t x) const { return (__umulhi(x, m) + x) >> s; }
};
template <>
struct Divider<std::uint64_t> {
  std::uint64_t d = 1;
  Divider() = default;
  explicit Divider(std::uint64_t divisor) : d(divisor) {}
  __device__ __forceinline__ std::uint64_t div(std::uint64_t x) const { return x / d; }
};

// Note [Parameter layout] of sparsebit/sdk/kernels.h.
template <typename I>
struct ParamIndex {
  int kind = Layout::kTensor;
  Divider<I> inner, n, group;
  I blocks = 1;   // ceil(n / group)
  bool uniform4;  // the kVec elements of an item (starting at a multiple of kVec) share one parameter
  ParamIndex() = default;
  explicit ParamIndex(const Layout& l)
      : kind(l.kind),
        inner(I(l.inner)),
        n(I(l.n)),
        group(I(l.kind == Layout::kGroup ? l.group : 1)),
        blocks(I(l.kind == Layout::kGroup ? (l.n + l.group - 1) / l.group : 1)),
        uniform4(l.kind == Layout::kTensor || (l.kind == Layout::kChannel && l.inner % kVec == 0)) {}
  // Parameters of the item at e (elements past numel get e's).
  __device__ __forceinline__ void item(I e, I numel, I (&p)[kVec]) const {
    p[0] = (*this)(e);
#pragma unroll
    for (int j = 1; j < kVec; ++j) p[j] = uniform4 || e + j >= numel ? p[0] : (*this)(e + j);
  }
  __device__ __forceinline__ I operator()(I e) const {
    if (kind == Layout::kTensor) return 0;
    const I row = inner.div(e);
    const I o = n.div(row);
    const I k = row - o * n.d;
    if (kind == Layout::kChannel) return k;
    return (o * blocks + group.div(k)) * inner.d + (e - row * inner.d);
  }
};

template <bool kAligned, typename I, typename T>
__device__ __forceinline__ void load4(const T* p, I e, I numel, T (&v)[kVec]) {
  if (kAligned && e + kVec <= numel) {
    static_assert(sizeof(T) == 4, "4-byte elements");
    const float4 t = *reinterpret_cast<const float4*>(p + e);
    const T* u = reinterpret_cast<const T*>(&t);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = u[j];
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = e + j < numel ? p[e + j] : T(0);
  }
}

template <bool kAligned, typename I, typename T>
__device__ __forceinline__ void store4(T* p, I e, I numel, const T (&v)[kVec]) {
  if (kAligned && e + kVec <= numel) {
    float4 t;
    T* u = reinterpret_cast<T*>(&t);
#pragma unroll
    for (int j = 0; j < kVec; ++j) u[j] = v[j];
    *reinterpret_cast<float4*>(p + e) = t;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (e + j < numel) p[e + j] = v[j];
  }
}

// clamp as ATen's: NaN stays NaN.
__device__ __forceinline__ float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

struct Params {
  const float* scale;
  const float* zero_point;
  float qmin, qmax;
};

// --- dispatch ---------------------------------------------------------------------------------

inline bool aligned(const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline Params params_of(const QuantPtrs& a) { return {a.scale, a.zero_point, float(a.qmin), float(a.qmax)}; }

// Calls f(aligned, index) with the 16-byte alignment (std::integral_constant<bool>) and the
// index type (32-bit below 2^31 elements) chosen at run time.
template <class F>
void dispatch(std::int64_t numel, bool is_aligned, F f) {
  const bool small = numel < (std::int64_t{1} << 31);
  if (small && is_aligned) f(std::true_type{}, std::uint32_t{});
  else if (small) f(std::false_type{}, std::uint32_t{});
  else if (is_aligned) f(std::true_type{}, std::uint64_t{});
  else f(std::false_type{}, std::uint64_t{});
}

}  // namespace
}  // namespace sparsebit::cuda
