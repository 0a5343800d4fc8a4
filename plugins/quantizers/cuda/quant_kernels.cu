// CUDA kernels for the quantization arithmetic of sparsebit/sdk/quant.h.
//
// Bit-exactness: every float operation the reference (ATen) performs is done here with the
// same IEEE-rounded intrinsic in the same order (__fdiv_rn, __fadd_rn, __fmul_rn; rintf is
// round half to even), and nothing is contracted into a fused multiply-add (also --fmad=false),
// so the quantized integers equal the CPU's for every finite input.
//
// Element-wise kernels share one driver (map_kernel) with an operation each: two items of 4
// consecutive floats per thread per step (16-byte vectors when every pointer is aligned) in a
// grid-stride loop. Reductions to per-parameter
// values (LSQ's scale and zero-point gradients, min/max) keep a running value per thread while
// its parameter stays the same, combine contiguous runs of lanes with the same parameter by
// warp shuffles, and only then apply one atomic per run (Note [Warp runs]).

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
constexpr unsigned kFullMask = 0xffffffffu;

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

int multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0)
    return 80;
  return count;
}

// Blocks for `items` work items of kVec elements: enough to fill every multiprocessor several
// times, no more (the grid-stride loop covers the rest).
unsigned blocks_for(std::int64_t numel) {
  const std::int64_t items = (numel + kVec - 1) / kVec;
  const std::int64_t wanted = (items + kThreads - 1) / kThreads;
  const std::int64_t cap = std::int64_t(multiprocessors()) * 16;
  return unsigned(wanted < 1 ? 1 : wanted > cap ? cap : wanted);
}

// Reductions use fewer, longer-lived warps: each ends with atomics per parameter run, which for
// a per-tensor reduction all hit one address.
unsigned reduction_blocks(std::int64_t numel) {
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

// Note [Warp runs]
// Lanes of a warp cover consecutive elements, so lanes that share a parameter form contiguous
// runs. Each lane combines the values of the lanes after it in its run (a shuffle tree bounded
// by the run's end); the first lane of each run then holds the run's total and applies it. A
// lane with parameter `none` holds nothing. Every lane of the warp must call this together.
template <typename I, class Combine, class Apply>
__device__ __forceinline__ void warp_flush(I p, float a, float b, Combine combine, Apply apply) {
  const unsigned lane = threadIdx.x & 31u;
  const I before = __shfl_up_sync(kFullMask, p, 1);
  const bool head = lane == 0 || before != p;
  const unsigned heads = __ballot_sync(kFullMask, head);
  const unsigned later = heads & ~((2u << lane) - 1u);
  const unsigned end = later ? unsigned(__ffs(int(later)) - 1) : 32u;
#pragma unroll
  for (unsigned off = 1; off < 32; off <<= 1) {
    const float oa = __shfl_down_sync(kFullMask, a, off);
    const float ob = __shfl_down_sync(kFullMask, b, off);
    if (lane + off < end) combine(a, b, oa, ob);
  }
  if (head && p != ~I(0)) apply(p, a, b);
}

struct Sum {
  __device__ void operator()(float& a, float& b, float oa, float ob) const {
    a += oa;
    b += ob;
  }
};
struct MinMax {
  __device__ void operator()(float& a, float& b, float oa, float ob) const {
    a = fminf(a, oa);
    b = fmaxf(b, ob);
  }
};

struct AddTo {
  float* first;
  float* second;
  template <typename I>
  __device__ void operator()(I p, float a, float b) const {
    atomicAdd(first + p, a);
    if (second) atomicAdd(second + p, b);
  }
};

// Min/max as unsigned keys that order like the floats (sign bit flipped for non-negative values,
// all bits for negative ones), so plain integer atomics apply. NaN is sticky: it becomes key 0
// for the minimum and the largest key for the maximum, and decodes back to NaN.
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_key(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
constexpr unsigned kNanMaxKey = 0xffffffffu;
struct MinMaxTo {
  unsigned* lo;  // keys
  unsigned* hi;
  template <typename I>
  __device__ void operator()(I p, float a, float b) const {
    atomicMin(lo + p, isnan(a) ? 0u : order_key(a));
    atomicMax(hi + p, isnan(b) ? kNanMaxKey : order_key(b));
  }
};

// Per-parameter reduction driver. Each warp owns one contiguous span of the tensor (so a
// parameter changes rarely along it) and walks it kItems items per lane at a time, all loads
// issued before any arithmetic. `item.load(e, regs)` reads an item; `item.compute(e, regs, p, a,
// b)` gives its parameter (or none when its elements span several, having applied them itself)
// and values. Equal parameters accumulate in registers; the warp flushes (Note [Warp runs]) when
// any lane's parameter changes.
constexpr int kItems = 4;
template <typename I, class Item, class Combine, class Apply>
__device__ __forceinline__ void reduce_items(I numel, const Item& item, Combine combine, Apply apply, float ia,
                                             float ib) {
  const I none = ~I(0);
  const unsigned lane = threadIdx.x & 31u;
  constexpr I kStep = I(32) * kVec * kItems;
  const I warps = I(gridDim.x) * (blockDim.x / 32);
  const I warp = I(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const I span = ((numel + warps - 1) / warps + kStep - 1) / kStep * kStep;
  const I begin = warp * span;
  const I end = begin + span < numel ? begin + span : numel;
  I cp = none;
  float ca = ia, cb = ib;
  for (I base = begin; base < end; base += kStep) {
    typename Item::Regs r[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) item.load(base + I(u) * 32 * kVec + I(lane) * kVec, r[u]);
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const I e = base + I(u) * 32 * kVec + I(lane) * kVec;
      I p = none;
      float a = ia, b = ib;
      if (e < numel) item.compute(e, r[u], p, a, b);
      if (__any_sync(kFullMask, p != cp)) {
        warp_flush(cp, ca, cb, combine, apply);
        cp = p;
        ca = a;
        cb = b;
      } else {
        combine(ca, cb, a, b);
      }
    }
  }
  warp_flush(cp, ca, cb, combine, apply);
}

template <bool kAligned, typename I>
struct LsqBackwardItem {
  const float *x, *g;
  float* gx;
  I numel;
  ParamIndex<I> pidx;
  Params P;
  AddTo direct;
  struct Regs {
    float x[kVec], g[kVec];
  };
  __device__ __forceinline__ void load(I e, Regs& r) const {
    if (e < numel) {
      load4<kAligned>(x, e, numel, r.x);
      load4<kAligned>(g, e, numel, r.g);
    }
  }
  __device__ __forceinline__ void compute(I e, const Regs& r, I& p_out, float& a, float& b) const {
    float out[kVec], ds[kVec], dz[kVec];
    I ps[kVec];
    pidx.item(e, numel, ps);
    bool same = true;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      same = same && ps[j] == ps[0];
      const float s = __ldg(P.scale + ps[j]), zp = __ldg(P.zero_point + ps[j]);
      const float xs = __fdiv_rn(r.x[j], s);
      const float u = __fadd_rn(xs, zp);
      const bool inside = u >= P.qmin && u <= P.qmax;
      const float c = clampf(u, P.qmin, P.qmax);
      out[j] = inside ? r.g[j] : 0.0f;
      // dy/ds = round(v) - zp - x/s inside, (clamped bound) - zp outside; dy/dzp = -s outside.
      const float local = inside ? rintf(u) - zp - xs : c - zp;
      const bool valid = e + j < numel;
      ds[j] = valid ? r.g[j] * local : 0.0f;
      dz[j] = valid && !inside ? -r.g[j] * s : 0.0f;
    }
    store4<kAligned>(gx, e, numel, out);
    if (same) {
      p_out = ps[0];
      a = (ds[0] + ds[1]) + (ds[2] + ds[3]);
      b = (dz[0] + dz[1]) + (dz[2] + dz[3]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (e + j < numel) direct(ps[j], ds[j], dz[j]);
    }
  }
};

template <bool kAligned, typename I>
__global__ void lsq_backward_kernel(LsqBackwardItem<kAligned, I> item) {
  reduce_items(item.numel, item, Sum{}, item.direct, 0.0f, 0.0f);
}

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

// --- observers --------------------------------------------------------------------------------

template <bool kAligned, typename I>
struct RangeItem {
  const float* x;
  I numel;
  ParamIndex<I> pidx;
  MinMaxTo direct;
  struct Regs {
    float x[kVec];
  };
  __device__ __forceinline__ void load(I e, Regs& r) const {
    if (e < numel) load4<kAligned>(x, e, numel, r.x);
  }
  __device__ __forceinline__ void compute(I e, const Regs& r, I& p_out, float& a, float& b) const {
    I ps[kVec];
    pidx.item(e, numel, ps);
    bool same = true;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      same = same && ps[j] == ps[0];
      if (e + j < numel && isnan(r.x[j])) direct(ps[j], r.x[j], r.x[j]);
    }
    if (same) {
      p_out = ps[0];
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (e + j < numel) {
          a = fminf(a, r.x[j]);
          b = fmaxf(b, r.x[j]);
        }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (e + j < numel) direct(ps[j], r.x[j], r.x[j]);
    }
  }
};

template <bool kAligned, typename I>
__global__ void range_kernel(RangeItem<kAligned, I> item) {
  reduce_items(item.numel, item, MinMax{}, item.direct, __int_as_float(0x7f800000), __int_as_float(0xff800000));
}

__global__ void init_keys_kernel(unsigned* lo, unsigned* hi, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    lo[i] = 0xffffffffu;  // above every float's key but NaN's maximum key
    hi[i] = 0u;
  }
}
__global__ void decode_keys_kernel(unsigned* lo, unsigned* hi, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const unsigned l = lo[i], h = hi[i];
    reinterpret_cast<float*>(lo)[i] = l == 0u ? __uint_as_float(0x7fc00000u) : from_key(l);
    reinterpret_cast<float*>(hi)[i] = h == kNanMaxKey ? __uint_as_float(0x7fc00000u) : from_key(h);
  }
}

__device__ __forceinline__ long long bin_of(float v, double range, double width, long long bins) {
  const double t = floor(__ddiv_rn(__dadd_rn(double(v), range), width));
  if (!(t >= 0.0)) return 0;  // below the range (and NaN, which callers reject beforehand)
  return t > double(bins - 1) ? bins - 1 : (long long)t;
}

// One row per blockIdx.y, its bins counted in shared memory and added to global memory once.
__global__ void histogram_shared_kernel(const float* x, long long rows, long long cols, double range, double width,
                                        int bins, unsigned long long* counts) {
  extern __shared__ unsigned int local[];
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
    __syncthreads();
    const float* row = x + r * cols;
    for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
         c += (long long)gridDim.x * blockDim.x)
      atomicAdd(local + bin_of(row[c], range, width, bins), 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
      if (local[b]) atomicAdd(counts + r * bins + b, (unsigned long long)local[b]);
    __syncthreads();
  }
}

__global__ void histogram_global_kernel(const float* x, long long rows, long long cols, double range, double width,
                                        long long bins, unsigned long long* counts) {
  const long long total = rows * cols;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x)
    atomicAdd(counts + (i / cols) * bins + bin_of(x[i], range, width, bins), 1ull);
}

// --- dispatch ---------------------------------------------------------------------------------

bool aligned(const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

Params params_of(const QuantPtrs& a) { return {a.scale, a.zero_point, float(a.qmin), float(a.qmax)}; }

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

#define SPARSEBIT_TYPES      \
  using I = decltype(index); \
  constexpr bool A = decltype(al)::value

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

void lsq_backward(const QuantPtrs& a, const float* grad, float* grad_x, float* grad_scale, float* grad_zero_point,
                  cudaStream_t stream) {
  if (a.numel == 0) return;
  dispatch(a.numel, aligned(a.x) && aligned(grad) && aligned(grad_x), [&](auto al, auto index) {
    SPARSEBIT_TYPES;
    LsqBackwardItem<A, I> item{
        a.x, grad, grad_x, I(a.numel), ParamIndex<I>(a.layout), params_of(a), AddTo{grad_scale, grad_zero_point}};
    lsq_backward_kernel<A, I><<<reduction_blocks(a.numel), kThreads, 0, stream>>>(item);
  });
  check_launch("lsq_backward");
}

void soft_round_forward(const QuantPtrs& a, const float* v, float zeta, float gamma, float* y, cudaStream_t stream) {
  map<2>("soft_round_forward", {a.x, v}, y, a, SoftRoundOp{{zeta - gamma, gamma}}, stream);
}

void soft_round_backward(const QuantPtrs& a, const float* v, float zeta, float gamma, const float* grad, float* grad_v,
                         cudaStream_t stream) {
  map<3>("soft_round_backward", {a.x, v, grad}, grad_v, a, SoftRoundBackwardOp{{zeta - gamma, gamma}}, stream);
}

void range_per_param(const float* x, std::int64_t numel, const Layout& layout, float* lo, float* hi,
                     cudaStream_t stream) {
  if (numel == 0) return;
  const std::int64_t params = layout.kind == Layout::kTensor ? 1
                              : layout.kind == Layout::kChannel
                                  ? layout.n
                                  : layout.outer * ((layout.n + layout.group - 1) / layout.group) * layout.inner;
  // The keys live in the output buffers themselves (same size as floats) until decoded.
  unsigned* lo_key = reinterpret_cast<unsigned*>(lo);
  unsigned* hi_key = reinterpret_cast<unsigned*>(hi);
  const unsigned init_blocks = unsigned((params + kThreads - 1) / kThreads);
  init_keys_kernel<<<init_blocks, kThreads, 0, stream>>>(lo_key, hi_key, params);
  dispatch(numel, aligned(x), [&](auto al, auto index) {
    SPARSEBIT_TYPES;
    RangeItem<A, I> item{x, I(numel), ParamIndex<I>(layout), MinMaxTo{lo_key, hi_key}};
    range_kernel<A, I><<<reduction_blocks(numel), kThreads, 0, stream>>>(item);
  });
  decode_keys_kernel<<<init_blocks, kThreads, 0, stream>>>(lo_key, hi_key, params);
  check_launch("range_per_param");
}
#undef SPARSEBIT_TYPES

void histogram(const float* x, std::int64_t rows, std::int64_t cols, double range, std::int64_t bins,
               unsigned long long* counts, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const double width = 2 * range / double(bins);
  constexpr std::int64_t kSharedBins = 12288;  // 48 KiB of 32-bit counters
  if (bins <= kSharedBins) {
    // About two blocks per multiprocessor in all, each over at least 4096 values of its row
    // (every block adds its bins to global memory once).
    const std::int64_t by_size = (cols + 4095) / 4096, by_sms = (2 * std::int64_t(multiprocessors()) + rows - 1) / rows;
    const std::int64_t per_row = by_size < by_sms ? by_size : by_sms;
    const unsigned gx = unsigned(per_row < 1 ? 1 : per_row);
    const unsigned gy = unsigned(rows > 65535 ? 65535 : rows);
    histogram_shared_kernel<<<dim3(gx, gy), kThreads, std::size_t(bins) * sizeof(unsigned), stream>>>(
        x, rows, cols, range, width, int(bins), counts);
  } else {
    histogram_global_kernel<<<blocks_for(rows * cols * kVec), kThreads, 0, stream>>>(x, rows, cols, range, width, bins,
                                                                                     counts);
  }
  check_launch("histogram");
}

}  // namespace sparsebit::cuda
