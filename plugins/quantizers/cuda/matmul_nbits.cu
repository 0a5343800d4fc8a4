// 4-bit weight kernels for MatMulNBits (Note [MatMulNBits kernels] in sparsebit/sdk/kernels.h).
//
// Decode (a few rows of activations) is bound by reading the weight: gemv_nbits4 reads every byte
// of B once, 16 bytes per thread and column at a time, turns the codes into floats in registers
// and multiplies them with the activations of all rows at once. Each thread serves 4 columns, so
// an activation loaded into registers is used 4 times (the activations come from L1/L2, and
// without that reuse their traffic there would rival the weight's in DRAM). The threads of one
// column group split K and are combined by warp shuffles, then shared memory.
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

}  // namespace

bool gemv_nbits4_supported(const Nbits4Weight& w, const void* a, std::int64_t m) {
  return m >= 1 && m <= kMaxGemvRows && w.block % kChunk == 0 && w.k % kChunk == 0 && aligned16(w.b) && aligned16(a);
}

void gemv_nbits4(const Nbits4Weight& w, const void* a, std::int64_t m, bool half, void* y, cudaStream_t stream) {
  if (!gemv_nbits4_supported(w, a, m)) throw std::runtime_error("gemv_nbits4: unsupported shape or alignment");
  if (half) gemv_rows<__half>(w, a, m, y, stream);
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
