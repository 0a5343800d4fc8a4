#pragma once
// Shared by the GPU benchmark programs: the median of CUDA-event timings.

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace sparsebit::bench {

/// Median in ms of `iterations` runs of f on the current stream (CUDA events around each run),
/// after `warmup` runs that are not timed.
inline double gpu_median_ms(const std::function<void()>& f, int iterations, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> times;
  for (int i = 0; i < iterations; ++i) {
    cudaEventRecord(a, stream);
    f();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace sparsebit::bench
