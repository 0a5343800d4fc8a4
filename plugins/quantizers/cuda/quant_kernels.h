#pragma once
// Launchers of the CUDA kernels in quant_kernels.cu and quant_reductions.cu: raw device pointers,
// no ATen, so the .cu files compile with nvcc alone (CI compiles them on machines without a CUDA
// LibTorch).
// Every launcher throws std::runtime_error naming the kernel if the launch fails.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sparsebit::cuda {

// Note [Parameter layout] of sparsebit/sdk/kernels.h: x viewed as [outer, n, inner].
struct Layout {
  enum Kind : int { kTensor = 0, kChannel = 1, kGroup = 2 };
  int kind = kTensor;
  std::int64_t outer = 1, n = 1, inner = 1, group = 1;
};

struct QuantPtrs {
  const float* x;
  const float* scale;
  const float* zero_point;
  std::int64_t numel;
  Layout layout;
  std::int64_t qmin, qmax;
};

void fake_quantize(const QuantPtrs& a, float* y, cudaStream_t stream);
void fake_quantize_backward(const QuantPtrs& a, const float* grad, float* grad_x, cudaStream_t stream);
void quantize_to_int(const QuantPtrs& a, std::int32_t* q, cudaStream_t stream);

void lsq_forward(const QuantPtrs& a, float* y, cudaStream_t stream);
// grad_scale and grad_zero_point (one per parameter) must be zeroed: the kernel adds to them.
void lsq_backward(const QuantPtrs& a, const float* grad, float* grad_x, float* grad_scale, float* grad_zero_point,
                  cudaStream_t stream);

void soft_round_forward(const QuantPtrs& a, const float* v, float zeta, float gamma, float* y, cudaStream_t stream);
void soft_round_backward(const QuantPtrs& a, const float* v, float zeta, float gamma, const float* grad, float* grad_v,
                         cudaStream_t stream);

// Per-parameter minimum and maximum (NaN where a covered element is NaN) into lo and hi
// (layout's parameter count each).
void range_per_param(const float* x, std::int64_t numel, const Layout& layout, float* lo, float* hi,
                     cudaStream_t stream);

// counts [rows, bins] must be zeroed.
void histogram(const float* x, std::int64_t rows, std::int64_t cols, double range, std::int64_t bins,
               unsigned long long* counts, cudaStream_t stream);

}  // namespace sparsebit::cuda
