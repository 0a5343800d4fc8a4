// CUDA kernels that reduce to per-parameter values for sparsebit/sdk/quant.h: LSQ's scale and
// zero-point gradients, per-parameter minimum and maximum, histograms (bit-exact with the CPU:
// quant_kernels_common.cuh).
//
// Reductions keep a running value per thread while its parameter stays the same, combine
// contiguous runs of lanes with the same parameter by warp shuffles, and only then apply one
// atomic per run (Note [Warp runs]).

#include "quant_kernels_common.cuh"

namespace sparsebit::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

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

}  // namespace

#define SPARSEBIT_TYPES      \
  using I = decltype(index); \
  constexpr bool A = decltype(al)::value

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
