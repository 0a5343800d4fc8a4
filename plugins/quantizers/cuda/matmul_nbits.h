#pragma once
// Launchers of the 4-bit weight kernels in matmul_nbits.cu (Note [MatMulNBits kernels] in
// sparsebit/sdk/kernels.h): raw device pointers, no ATen, like quant_kernels.h.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sparsebit::cuda {

// One MatMulNBits weight: B [n, k_blocks, block / 2] uint8 (two 4-bit codes a byte, low nibble
// first), scales [n, k_blocks] in the activations' type, zero points packed the same way
// ([n, ceil(k_blocks / 2)] uint8) or nullptr for 8. block: a power of two, at least 16; k < 2^31.
struct Nbits4Weight {
  const std::uint8_t* b;
  const void* scales;
  const std::uint8_t* zero_points;
  std::int64_t n, k, block;
  std::int64_t blocks() const { return (k + block - 1) / block; }
};

// Whether gemv_nbits4 takes this weight and these pointers (block a multiple of 32, rows of B
// and of A a multiple of 16 bytes and 16-byte aligned, 1 <= m <= gemv_nbits4_max_rows: float16
// activations on a GPU with tensor cores for float16 (sm_80 on) take up to kMaxMmaGemvRows,
// others kMaxGemvRows; asked of the current device).
inline constexpr std::int64_t kMaxGemvRows = 8;
inline constexpr std::int64_t kMaxMmaGemvRows = 16;
std::int64_t gemv_nbits4_max_rows(bool half);
bool gemv_nbits4_supported(const Nbits4Weight& w, const void* a, std::int64_t m, bool half);

// y [m, n] = a [m, k] x W^T for few rows (decode): reads each weight byte once, dequantizes in
// registers and accumulates in float32 (float16 weights into the tensor cores' float32 sums). half: a, scales and y are
// float16, else float32.
void gemv_nbits4(const Nbits4Weight& w, const void* a, std::int64_t m, bool half, void* y, cudaStream_t stream);

// W [n, k] in float32 or float16 (half), for many rows (prefill): dequantize once, then a
// matrix product.
void dequantize_nbits4(const Nbits4Weight& w, bool half, void* out, cudaStream_t stream);

}  // namespace sparsebit::cuda
