// 4-bit weight kernels for MatMulNBits (Note [MatMulNBits kernels] in sparsebit/sdk/kernels.h).
//
// Decode (a few rows of activations) is bound by reading the weight, so every path below reads
// each byte of B once and turns the codes into numbers in registers.
//
// float16 activations, 1 to 16 rows, sm_80 and later (gemv_mma_kernel): the tensor cores do the
// multiply-adds. A warp owns 16 rows of W (one m16n8k16 A tile) and a slice of K; each thread
// turns 8 codes into four float16 pairs with two logic operations each (code | 0x6400 is the
// float16 1024 + code, so one subtraction of 1024 + zero point is exact), scales them, and feeds
// them with the activations (the B tile, rows of A as its 8 columns) to mma. The multiply-adds,
// which dominate on the CUDA cores, cost one instruction per 2 048 of them; accumulation is float32.
// The warps of a block split K and meet in shared memory.
//
// float32 activations (and GPUs before sm_80): gemv_kernel does the multiply-adds in float32 on
// the CUDA cores: 16 bytes per thread and column at a time, 4 columns per thread so an
// activation loaded into registers is used 4 times; the threads of one column group split K and
// are combined by warp shuffles, then shared memory.
//
// Prefill (hundreds of rows) is bound by arithmetic: dequantize_nbits4 writes W once in the
// activations' type and a cuBLAS product follows (in the plugin), which costs one pass over a
// float weight against hundreds of row-products.
//
// Unlike quant_kernels.cu this file may contract multiply-adds: these are float dot products,
// compared with the reference to a tolerance, not rounded to an integer grid.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "matmul_nbits.h"

namespace sparsebit::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kColumns = 4;  // columns per thread (the pipelined copies below list four)
constexpr int kChunk = 32;   // codes per thread and column per step (16 bytes)

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

// 8 consecutive activations starting at p (16-byte aligned for float16, 32 for float32).
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const __half* p, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float zero_point_of(const std::uint8_t* zp, std::int64_t zp_row, std::int64_t col, int g) {
  if (!zp) return 8.f;
  return float((zp[col * zp_row + (g >> 1)] >> (4 * (g & 1))) & 0xF);
}

int log2_of(std::int64_t power_of_two) {
  int shift = 0;
  while ((std::int64_t{1} << shift) < power_of_two) ++shift;
  return shift;
}

// Block: kThreads threads in groups of `group` threads (32, 64 or 128); each group owns kColumns
// columns, its threads take the 32-code chunks of K in turn.
template <typename T, int M>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const std::uint8_t* __restrict__ b, const T* __restrict__ scales, const std::uint8_t* __restrict__ zps,
                const T* __restrict__ a, T* __restrict__ y, std::int64_t n, int k, int block_shift, int group) {
  __shared__ float partial[kThreads / 32][M * kColumns];
  // 32-bit arithmetic along K (K < 2^31) and shifts for the power-of-two block: 64-bit division
  // is a long instruction sequence on GPUs.
  const int blocks = (k + (1 << block_shift) - 1) >> block_shift;
  const std::int64_t row_bytes = std::int64_t(blocks) << (block_shift - 1), zp_row = (blocks + 1) / 2;
  const int groups = kThreads / group;
  const int g_id = threadIdx.x / group, t = threadIdx.x % group;
  const std::int64_t col0 = (std::int64_t(blockIdx.x) * groups + g_id) * kColumns;

  float acc[M][kColumns];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) acc[m][c] = 0.f;

  // Software pipelining: the codes, scales and zero points of the thread's next chunk are loaded
  // before the current one is computed, so two chunks' loads are in flight per thread.
  const int stride = group * kChunk;
  uint4 codes[kColumns];
  float scale[kColumns], zero[kColumns];
  auto load_chunk = [&](int k0) {
    const int g = k0 >> block_shift;  // block is a multiple of kChunk: one group per chunk
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      const std::int64_t col = col0 + c;
      if (col < n && k0 < k) {
        codes[c] = __ldg(reinterpret_cast<const uint4*>(b + col * row_bytes + k0 / 2));
        scale[c] = to_float(scales[col * blocks + g]);
        // (code | 2^23 as a float) - 2^23 is the code; subtracting the zero point as well.
        zero[c] = 8388608.f + zero_point_of(zps, zp_row, col, g);
      } else {
        codes[c] = make_uint4(0, 0, 0, 0);
        scale[c] = 0.f;
        zero[c] = 8388608.f;
      }
    }
  };
  load_chunk(t * kChunk);
  for (int k0 = t * kChunk; k0 < k; k0 += stride) {
    const uint4 cur[kColumns] = {codes[0], codes[1], codes[2], codes[3]};
    const float cur_scale[kColumns] = {scale[0], scale[1], scale[2], scale[3]};
    const float cur_zero[kColumns] = {zero[0], zero[1], zero[2], zero[3]};
    if (k0 + stride < k) load_chunk(k0 + stride);
    float dot[M][kColumns];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int c = 0; c < kColumns; ++c) dot[m][c] = 0.f;
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      float x[M][8];
#pragma unroll
      for (int m = 0; m < M; ++m) load8(a + std::int64_t(m) * k + k0 + 8 * word, x[m]);
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        const unsigned w = word == 0 ? cur[c].x : word == 1 ? cur[c].y : word == 2 ? cur[c].z : cur[c].w;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float q = __uint_as_float(((w >> (4 * j)) & 0xFu) | 0x4B000000u) - cur_zero[c];
#pragma unroll
          for (int m = 0; m < M; ++m) dot[m][c] += x[m][j] * q;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int c = 0; c < kColumns; ++c) acc[m][c] += dot[m][c] * cur_scale[c];
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      float v = acc[m][c];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) partial[warp][m * kColumns + c] = v;
    }
  __syncthreads();
  const int warps_per_group = group / 32;
  for (int i = threadIdx.x; i < groups * M * kColumns; i += kThreads) {
    const int gi = i / (M * kColumns), mc = i % (M * kColumns), m = mc / kColumns, c = mc % kColumns;
    const std::int64_t col = (std::int64_t(blockIdx.x) * groups + gi) * kColumns + c;
    if (col >= n) continue;
    float v = 0.f;
    for (int w = 0; w < warps_per_group; ++w) v += partial[gi * warps_per_group + w][mc];
    store(y + m * n + col, v);
  }
}

constexpr int kMmaMaxWarps = 16;
constexpr int kMmaStep = 128;  // codes of K per warp step: 4 threads x 32 codes of each W row

// Four float16 pairs (code j, code j + 4), j = 0..3, of the 8 codes in w, as code - zero, times
// the scale unless the scale comes after the product (kScaleAfter).
template <bool kScaleAfter>
__device__ __forceinline__ void dequantize8(unsigned w, __half2 zero, __half2 scale, unsigned (&pairs)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned v = ((w >> (4 * j)) & 0x000F000Fu) | 0x64006400u;
    __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&v), zero);
    if constexpr (!kScaleAfter) h = __hmul2(h, scale);
    pairs[j] = *reinterpret_cast<const unsigned*>(&h);
  }
}

__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // launched only where has_mma() holds, whose code is compiled for sm_80 on
#endif
}

// Steps whose weights one thread loads before using any. Decode is bound by the bytes on their way
// from memory per SM: two steps at 62 registers (two blocks of 512 threads per SM) beat four at
// 98 (one block) by 5-20% on an H100 (bench/RESULTS.md). The activations, the same for every
// block, come from L1 at use rather than taking registers.
constexpr int kMmaDepth = 2;

// What one thread reads of W for one warp step: 32 codes of its two W rows (gid and gid + 8 of
// the tile), their groups' scale and zero point.
struct MmaWeights {
  uint4 w[2];
  __half2 zero[2], scale[2];
};

// Block: 16 rows of W, `warps` warps taking K's 128-code steps in turn, kMmaDepth steps' weights
// loaded before any is used. Thread (gid, t) of a warp holds W rows gid and gid + 8 and, per mma,
// the K slots {2t, 2t + 1, 2t + 8, 2t + 9}; which codes fill them only has to agree between A and
// B, so each thread gives its slots its own 8 consecutive codes and the activations of the same
// positions. kScaleAfter (groups of 128 and more, so a step lies in one group): the step's sums
// are scaled in float32, 4 multiply-adds in place of 32 float16 multiplications.
template <int NT, bool kScaleAfter>
__global__ void __launch_bounds__(kMmaMaxWarps * 32)
    gemv_mma_kernel(const std::uint8_t* __restrict__ b, const __half* __restrict__ scales,
                    const std::uint8_t* __restrict__ zps, const __half* __restrict__ a, __half* __restrict__ y,
                    std::int64_t n, int m, int k, int block_shift) {
  __shared__ float partial[kMmaMaxWarps][16][8 * NT];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, t = lane % 4;
  const int blocks = (k + (1 << block_shift) - 1) >> block_shift;
  const std::int64_t row_bytes = std::int64_t(blocks) << (block_shift - 1), zp_row = (blocks + 1) / 2;
  const std::int64_t row0 = std::int64_t(blockIdx.x) * 16;
  const int steps = (k + kMmaStep - 1) / kMmaStep;

  auto fetch = [&](int step, MmaWeights& f) {
    const int k0 = step * kMmaStep + 32 * t;  // a group holds whole 32-code chunks (block >= 32)
    const int g = k0 >> block_shift;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t row = row0 + gid + 8 * r;
      if (step < steps && k0 < k && row < n) {
        f.w[r] = __ldg(reinterpret_cast<const uint4*>(b + row * row_bytes + k0 / 2));
        f.scale[r] = __half2half2(scales[row * blocks + g]);
        f.zero[r] = __half2half2(__float2half_rn(1024.f + zero_point_of(zps, zp_row, row, g)));
      } else {
        f.w[r] = make_uint4(0, 0, 0, 0);
        f.scale[r] = __float2half2_rn(0.f);
        f.zero[r] = __float2half2_rn(1024.f);
      }
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

  float step_acc[NT][4];
  for (int first = warp; first < steps; first += warps * kMmaDepth) {
    MmaWeights ws[kMmaDepth];
#pragma unroll
    for (int d = 0; d < kMmaDepth; ++d) fetch(first + d * warps, ws[d]);
#pragma unroll
    for (int d = 0; d < kMmaDepth; ++d) {
      const int step = first + d * warps;
      if (step >= steps) break;  // the same for the whole warp
      const MmaWeights& cur = ws[d];
      const int k0 = step * kMmaStep + 32 * t;
      float(&sums)[NT][4] = kScaleAfter ? step_acc : acc;
      if constexpr (kScaleAfter)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) step_acc[nt][i] = 0.f;
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        unsigned lo[4], hi[4];  // W rows gid and gid + 8
        const unsigned w_lo = word == 0 ? cur.w[0].x : word == 1 ? cur.w[0].y : word == 2 ? cur.w[0].z : cur.w[0].w;
        const unsigned w_hi = word == 0 ? cur.w[1].x : word == 1 ? cur.w[1].y : word == 2 ? cur.w[1].z : cur.w[1].w;
        dequantize8<kScaleAfter>(w_lo, cur.zero[0], cur.scale[0], lo);
        dequantize8<kScaleAfter>(w_hi, cur.zero[1], cur.scale[1], hi);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // Activations k0 + 8 word + 0..7 of A row nt * 8 + gid, as the pairs (x_j, x_j+4) that
          // match the codes' pairs.
          const int xr = nt * 8 + gid;
          const uint4 x = k0 < k && xr < m ? __ldg(reinterpret_cast<const uint4*>(a + std::int64_t(xr) * k + k0) + word)
                                           : make_uint4(0, 0, 0, 0);
          const unsigned x04 = __byte_perm(x.x, x.z, 0x5410), x15 = __byte_perm(x.x, x.z, 0x7632);
          const unsigned x26 = __byte_perm(x.y, x.w, 0x5410), x37 = __byte_perm(x.y, x.w, 0x7632);
          mma16816(sums[nt], lo[0], hi[0], lo[1], hi[1], x04, x15);
          mma16816(sums[nt], lo[2], hi[2], lo[3], hi[3], x26, x37);
        }
      }
      if constexpr (kScaleAfter) {
        const float s_lo = __low2float(cur.scale[0]), s_hi = __low2float(cur.scale[1]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          acc[nt][0] += step_acc[nt][0] * s_lo, acc[nt][1] += step_acc[nt][1] * s_lo;
          acc[nt][2] += step_acc[nt][2] * s_hi, acc[nt][3] += step_acc[nt][3] * s_hi;
        }
      }
    }
  }

  // acc[nt]: (W row gid, A rows nt * 8 + 2t, + 1) and (W row gid + 8, the same A rows).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    partial[warp][gid][nt * 8 + 2 * t] = acc[nt][0];
    partial[warp][gid][nt * 8 + 2 * t + 1] = acc[nt][1];
    partial[warp][gid + 8][nt * 8 + 2 * t] = acc[nt][2];
    partial[warp][gid + 8][nt * 8 + 2 * t + 1] = acc[nt][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * 8 * NT; i += blockDim.x) {
    const int wr = i % 16, xr = i / 16;  // consecutive threads: consecutive outputs of one row
    const std::int64_t col = row0 + wr;
    if (xr >= m || col >= n) continue;
    float v = 0.f;
    for (int w = 0; w < warps; ++w) v += partial[w][wr][xr];
    y[std::int64_t(xr) * n + col] = __float2half_rn(v);
  }
}

__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__half* p, const float (&v)[8]) {
  uint4 raw;
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// One block per row of W; each thread turns 4 bytes (8 codes, one group: blocks are powers of two
// of at least 16) into 8 values, stored as one vector where K keeps rows 8-aligned.
template <typename T>
__global__ void dequantize_kernel(const std::uint8_t* __restrict__ b, const T* __restrict__ scales,
                                  const std::uint8_t* __restrict__ zps, T* __restrict__ out, int k, int block_shift) {
  const int blocks = (k + (1 << block_shift) - 1) >> block_shift;
  const std::int64_t row_bytes = std::int64_t(blocks) << (block_shift - 1), zp_row = (blocks + 1) / 2;
  const std::int64_t col = blockIdx.x;
  const unsigned* row = reinterpret_cast<const unsigned*>(b + col * row_bytes);
  T* out_row = out + col * k;
  for (int word = threadIdx.x; word * 8 < k; word += blockDim.x) {
    const int k0 = word * 8, g = k0 >> block_shift;
    const float s = to_float(scales[col * blocks + g]), z = zero_point_of(zps, zp_row, col, g);
    const unsigned codes = row[word];
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = (float((codes >> (4 * j)) & 0xFu) - z) * s;
    if (k % 8 == 0) {
      store8(out_row + k0, v);
    } else {
      for (int j = 0; j < 8 && k0 + j < k; ++j) store(out_row + k0 + j, v[j]);
    }
  }
}

template <typename T, int M>
void launch_gemv(const Nbits4Weight& w, const void* a, void* y, cudaStream_t stream) {
  // Threads per column group: two chunks per thread where K allows (one wave of blocks, two
  // loads in flight each), at most the whole block.
  int group = 32;
  while (group < kThreads && std::int64_t(group) * kChunk * 2 < w.k) group *= 2;
  const std::int64_t columns_per_block = std::int64_t(kThreads / group) * kColumns;
  const unsigned grid = unsigned((w.n + columns_per_block - 1) / columns_per_block);
  gemv_kernel<T, M><<<grid, kThreads, 0, stream>>>(w.b, static_cast<const T*>(w.scales), w.zero_points,
                                                   static_cast<const T*>(a), static_cast<T*>(y), w.n, int(w.k),
                                                   log2_of(w.block), group);
}

template <typename T>
void gemv_rows(const Nbits4Weight& w, const void* a, std::int64_t m, void* y, cudaStream_t stream) {
  switch (m) {
    case 1: return launch_gemv<T, 1>(w, a, y, stream);
    case 2: return launch_gemv<T, 2>(w, a, y, stream);
    case 3: return launch_gemv<T, 3>(w, a, y, stream);
    case 4: return launch_gemv<T, 4>(w, a, y, stream);
    case 5: return launch_gemv<T, 5>(w, a, y, stream);
    case 6: return launch_gemv<T, 6>(w, a, y, stream);
    case 7: return launch_gemv<T, 7>(w, a, y, stream);
    case 8: return launch_gemv<T, 8>(w, a, y, stream);
    default: throw std::runtime_error("gemv_nbits4: " + std::to_string(m) + " rows (1 to 8 are taken)");
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Tensor cores take float16 products from sm_80 on (asked of the current device).
bool has_mma() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  return major >= 8;
}

void launch_gemv_mma(const Nbits4Weight& w, const void* a, std::int64_t m, void* y, cudaStream_t stream) {
  // Enough warps per block for one round of kMmaDepth steps each where K allows; a block per 16
  // rows of W.
  const int steps = int((w.k + kMmaStep - 1) / kMmaStep);
  const int warps = std::clamp((steps + kMmaDepth - 1) / kMmaDepth, 1, kMmaMaxWarps);
  const unsigned grid = unsigned((w.n + 15) / 16);
  const auto* scales = static_cast<const __half*>(w.scales);
  const auto* x = static_cast<const __half*>(a);
  auto* out = static_cast<__half*>(y);
  const int shift = log2_of(w.block);
  const bool scale_after = w.block >= kMmaStep;
  const auto launch = [&](auto kernel) {
    kernel<<<grid, warps * 32, 0, stream>>>(w.b, scales, w.zero_points, x, out, w.n, int(m), int(w.k), shift);
  };
  if (m <= 8) scale_after ? launch(gemv_mma_kernel<1, true>) : launch(gemv_mma_kernel<1, false>);
  else scale_after ? launch(gemv_mma_kernel<2, true>) : launch(gemv_mma_kernel<2, false>);
}

}  // namespace

std::int64_t gemv_nbits4_max_rows(bool half) { return half && has_mma() ? kMaxMmaGemvRows : kMaxGemvRows; }

bool gemv_nbits4_supported(const Nbits4Weight& w, const void* a, std::int64_t m, bool half) {
  return m >= 1 && m <= gemv_nbits4_max_rows(half) && w.block % kChunk == 0 && w.k % kChunk == 0 && aligned16(w.b) &&
         aligned16(a);
}

void gemv_nbits4(const Nbits4Weight& w, const void* a, std::int64_t m, bool half, void* y, cudaStream_t stream) {
  if (!gemv_nbits4_supported(w, a, m, half)) throw std::runtime_error("gemv_nbits4: unsupported shape or alignment");
  if (half && has_mma()) launch_gemv_mma(w, a, m, y, stream);
  else if (half) gemv_rows<__half>(w, a, m, y, stream);
  else gemv_rows<float>(w, a, m, y, stream);
  check_launch("gemv_nbits4");
}

void dequantize_nbits4(const Nbits4Weight& w, bool half, void* out, cudaStream_t stream) {
  if (w.n == 0 || w.k == 0) return;
  const unsigned grid = unsigned(w.n);
  if (half)
    dequantize_kernel<__half><<<grid, 256, 0, stream>>>(w.b, static_cast<const __half*>(w.scales), w.zero_points,
                                                        static_cast<__half*>(out), int(w.k), log2_of(w.block));
  else
    dequantize_kernel<float><<<grid, 256, 0, stream>>>(w.b, static_cast<const float*>(w.scales), w.zero_points,
                                                       static_cast<float*>(out), int(w.k), log2_of(w.block));
  check_launch("dequantize_nbits4");
}

}  // namespace sparsebit::cuda
