// Throughput of the CUDA kernels (plugins/quantizers/cuda) in GB/s of memory traffic, against
// the card's memory bandwidth (its specification and a device-to-device copy measured here),
// PyTorch's own fused kernels (at::fake_quantize_per_channel_affine / per_tensor and the
// learnable LSQ ones) and our ATen reference chain (SPARSEBIT_KERNELS off), all in one run.
//
//   gpu_fake_quant_bench [--iterations N]
//
// "of copy" is against a device-to-device copy of the same tensor measured in the same run (the
// bandwidth a streaming kernel can reach); "of peak" against the specified bandwidth.
// Bytes per element: forward 8 (read x, write y); straight-through backward 12 (x, grad in,
// grad out); LSQ forward + backward 20; min/max 4. Times are CUDA-event medians over N runs
// after warm-up.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_bench_support.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/quant.h"

namespace {

using namespace sparsebit;

int g_iterations = 50;

double median_ms(const std::function<void()>& f) { return bench::gpu_median_ms(f, g_iterations); }

struct Row {
  std::string what, impl;
  double ms, gbs;
};
std::vector<Row> g_rows;
double g_peak = 0;
double g_copy = 0;  // GB/s of a device-to-device copy of the tensor at hand (read + write)

double copy_gbs(const at::Tensor& x) {
  at::Tensor scratch = at::empty_like(x);
  const double ms = median_ms([&] { scratch.copy_(x); });
  return 8.0 * double(x.numel()) / (ms * 1e-3) / 1e9;
}

void report(const std::string& what, const std::string& impl, double bytes, const std::function<void()>& f) {
  const double ms = median_ms(f);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  g_rows.push_back({what, impl, ms, gbs});
  std::printf("%-44s %-36s %9.3f ms %8.1f GB/s %6.1f%% of peak %6.1f%% of copy\n", what.c_str(), impl.c_str(), ms, gbs,
              100 * gbs / g_peak, 100 * gbs / g_copy);
}

QSpec spec_of(bool per_channel, std::int64_t axis) {
  QSpec s;
  s.bits = 8;
  s.symmetric = true;
  s.per_channel = per_channel;
  s.channel_axis = axis;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) g_iterations = std::max(5, std::atoi(argv[++i]));
  if (c10::cuda::device_count() == 0) {
    std::fprintf(stderr, "gpu_fake_quant_bench: no CUDA device\n");
    return 1;
  }
  Registry registry;
  registry.load({});
  if (!quant_kernels(c10::DeviceType::CUDA)) {
    std::fprintf(stderr, "gpu_fake_quant_bench: the cuda kernels plugin is not loaded (see `sparsebit plugins`)\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  g_peak = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);

  // Weight [4096, 4096] (64 MiB) per output channel; activation [64, 256, 56, 56] (196 MiB).
  at::manual_seed(0);
  const at::Tensor w = at::randn({4096, 4096}, cuda);
  const at::Tensor act = at::randn({64, 256, 56, 56}, cuda);
  std::printf(
      "device: %s, %d multiprocessors; memory bandwidth %.0f GB/s specified; device copy %.0f GB/s (weight), "
      "%.0f GB/s (activation)\n",
      prop.name, prop.multiProcessorCount, g_peak, copy_gbs(w), copy_gbs(act));
  std::printf("%-44s %-36s %12s %13s\n", "operation", "implementation", "median", "throughput");

  struct Tensorcase {
    std::string name;
    at::Tensor x;
    QSpec spec;
  };
  const std::vector<Tensorcase> cases = {
      {"weight [4096,4096] per-channel axis 0", w, spec_of(true, 0)},
      {"activation [64,256,56,56] per-channel axis 1", act, spec_of(true, 1)},
      {"activation [64,256,56,56] per-tensor", act, spec_of(false, 0)},
  };
  for (const auto& c : cases) {
    const at::Tensor& x = c.x;
    auto [lo, hi] = range_per_param(x, c.spec);
    const QParams p = qparams_from_range(lo, hi, c.spec, c.name);
    const double n = double(x.numel());
    const std::int64_t axis = c.spec.channel_axis;
    g_copy = copy_gbs(x);

    report(c.name + ": fake-quant", "sparsebit cuda kernel", 8 * n, [&] { fake_quantize(x, p, c.spec); });
    if (c.spec.per_channel) {
      report(c.name + ": fake-quant", "torch fake_quantize_per_channel_affine", 8 * n, [&] {
        at::fake_quantize_per_channel_affine(x, p.scale, p.zero_point, axis, c.spec.qmin(), c.spec.qmax());
      });
    } else {
      const double s = p.scale.item<double>();
      report(c.name + ": fake-quant", "torch fake_quantize_per_tensor_affine", 8 * n,
             [&] { at::fake_quantize_per_tensor_affine(x, s, 0, c.spec.qmin(), c.spec.qmax()); });
    }
    use_device_kernels(false);
    report(c.name + ": fake-quant", "sparsebit ATen reference", 8 * n, [&] { fake_quantize(x, p, c.spec); });
    use_device_kernels(true);

    const at::Tensor g = at::randn_like(x);
    report(c.name + ": STE backward", "sparsebit cuda kernel", 12 * n, [&] {
      quant_kernels(c10::DeviceType::CUDA)
          ->fake_quantize_backward(g, QuantArgs{x, p.scale, p.zero_point.to(at::kFloat), param_layout(x, c.spec),
                                                c.spec.qmin(), c.spec.qmax()});
    });

    // LSQ forward + backward, with the scale's gradient reduced per channel.
    const at::Tensor s0 = p.scale.clone().set_requires_grad(true);
    const at::Tensor z0 = p.zero_point.to(at::kFloat);
    const at::Tensor xg = x.detach().clone().set_requires_grad(true);
    report(c.name + ": LSQ fwd+bwd", "sparsebit cuda kernel", 20 * n,
           [&] { lsq_fake_quantize(xg, s0, z0, c.spec).backward(g); });
    if (c.spec.per_channel) {
      report(c.name + ": LSQ fwd+bwd", "torch _fake_quantize_learnable_per_channel", 20 * n, [&] {
        at::_fake_quantize_learnable_per_channel_affine(xg, s0, z0, axis, c.spec.qmin(), c.spec.qmax(), 1.0)
            .backward(g);
      });
    } else {
      report(c.name + ": LSQ fwd+bwd", "torch _fake_quantize_learnable_per_tensor", 20 * n, [&] {
        at::_fake_quantize_learnable_per_tensor_affine(xg, s0.reshape({1}), z0.reshape({1}), c.spec.qmin(),
                                                       c.spec.qmax(), 1.0)
            .backward(g);
      });
    }
    use_device_kernels(false);
    report(c.name + ": LSQ fwd+bwd", "sparsebit ATen reference", 20 * n,
           [&] { lsq_fake_quantize(xg, s0, z0, c.spec).backward(g); });
    use_device_kernels(true);

    report(c.name + ": min/max", "sparsebit cuda kernel", 4 * n, [&] { range_per_param(x, c.spec); });
    use_device_kernels(false);
    report(c.name + ": min/max", "sparsebit ATen reference", 4 * n, [&] { range_per_param(x, c.spec); });
    use_device_kernels(true);
  }

  {
    const at::Tensor rows = act.reshape({1, -1});
    g_copy = copy_gbs(rows);
    const double range = rows.abs().max().item<double>();
    report("histogram 4096 bins, 51M values", "sparsebit cuda kernel", 4.0 * double(rows.numel()),
           [&] { histogram_counts(rows, range, 4096); });
    use_device_kernels(false);
    report("histogram 4096 bins, 51M values", "sparsebit ATen reference", 4.0 * double(rows.numel()),
           [&] { histogram_counts(rows, range, 4096); });
    use_device_kernels(true);
  }

  // Ratios against the alternatives measured above, per operation.
  std::printf("\nspeed-up of the cuda kernel (other's time / kernel's time):\n");
  for (const Row& k : g_rows) {
    if (k.impl != "sparsebit cuda kernel") continue;
    for (const Row& o : g_rows)
      if (o.what == k.what && o.impl != k.impl)
        std::printf("  %-58s vs %-40s %6.2fx\n", k.what.c_str(), o.impl.c_str(), o.ms / k.ms);
  }
  return 0;
}
