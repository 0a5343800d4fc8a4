// 4-bit MatMulNBits on the GPU (Note [MatMulNBits kernels]) on the projections of one decoder
// layer of a 1 B-parameter model (hidden 2048, 32 query and 8 key/value heads of 64, MLP 8192:
// q, k, v, o, gate, up, down = 60.8 M weights), all seven products timed together, against in the
// same run:
//   dequant kernel + matmul   our dequantization kernel, then cuBLAS (the prefill path)
//   ATen dequant + matmul     what the executor did before the kernels: unpack, subtract, scale
//                             with ATen operators on every call, then matmul (SPARSEBIT_KERNELS=0)
//   float matmul              the float model's MatMul: cuBLAS with the weight [K, N] in A's type
// Rows of activations: 1, 2, 4, 8, 16 (decode), 128, 512 (prefill); float32 and float16; groups
// of 32 with zero points and of 128 without. Times are CUDA-event medians over --iterations runs,
// eager (each product dispatched from the host, as the executor does) and, for the 4-bit kernels
// and the float product, replayed from a CUDA graph (the GPU's own time). A second table times
// each projection alone at one row, for the 1 B layer and a 7 B one (4096 x 4096,
// 4096 x 11008, 11008 x 4096).
//
// A decode step reads every layer's weights once, far more than the GPU's L2 cache holds, so
// every timing cycles through enough copies of the weights (4-bit and float alike) that each
// product reads its weight from memory, not from L2, and reports the time per copy.
//
//   gpu_matmul_nbits_bench [--iterations N]

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "matmul_nbits.h"
#include "gpu_bench_support.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/kernels.h"

namespace {

using namespace sparsebit;

int g_iterations = 100;

double median_ms(const std::function<void()>& f) { return bench::gpu_median_ms(f, g_iterations, 5); }

// The same work recorded once as a CUDA graph and replayed: the GPU's time without the host's
// per-call dispatch (which an eager decode step pays per product, about 10 us here).
double graph_ms(const std::function<void()>& f) {
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(side);
  f();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  f();
  graph.capture_end();
  return median_ms([&] { graph.replay(); });
}

struct Projection {
  const char* name;
  std::int64_t k, n;
};
const std::vector<Projection> kLayer = {{"q", 2048, 2048},   {"k", 2048, 512},     {"v", 2048, 512},
                                        {"o", 2048, 2048},   {"gate", 2048, 8192}, {"up", 2048, 8192},
                                        {"down", 8192, 2048}};

struct Weight {
  MatMulNBitsArgs args;
  at::Tensor dense_t;  // [K, N] in the activations' type: the float model's weight
};

Weight make(const Projection& p, std::int64_t block, bool zero_points, at::ScalarType type) {
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);
  const std::int64_t blocks = (p.k + block - 1) / block;
  Weight w;
  w.args.b = at::randint(0, 256, {p.n, blocks, block / 2}, cuda.dtype(at::kByte));
  w.args.scales = (at::rand({p.n * blocks}, cuda) * 0.02 + 0.001).to(type);
  if (zero_points) w.args.zero_points = at::randint(0, 256, {p.n, (blocks + 1) / 2}, cuda.dtype(at::kByte));
  w.args.k = p.k;
  w.args.n = p.n;
  w.args.bits = 4;
  w.args.block_size = block;
  w.dense_t = at::randn({p.k, p.n}, cuda).to(type);
  return w;
}

// The executor's reference before the kernels (quantization_ops.cpp): float32 throughout.
at::Tensor aten_dequant_matmul(const at::Tensor& a, const MatMulNBitsArgs& w) {
  const std::int64_t blocks = (w.k + w.block_size - 1) / w.block_size;
  const at::Tensor p = w.b.to(at::kLong).reshape({w.n, -1});
  const at::Tensor codes =
      at::stack({at::bitwise_and(p, 15), at::bitwise_right_shift(p, 4)}, 2).reshape({w.n, -1}).narrow(1, 0, w.k);
  at::Tensor zp = at::full({w.n, blocks}, 8.0, a.options().dtype(at::kFloat));
  if (w.zero_points.defined()) {
    const at::Tensor z = w.zero_points.to(at::kLong).reshape({w.n, -1});
    zp = at::stack({at::bitwise_and(z, 15), at::bitwise_right_shift(z, 4)}, 2).reshape({w.n, -1}).narrow(1, 0, blocks);
  }
  const at::Tensor block_of = at::arange(w.k, a.options().dtype(at::kLong)).div(w.block_size, "floor");
  const at::Tensor scale = w.scales.to(at::kFloat).reshape({w.n, blocks});
  const at::Tensor dense =
      (codes.to(at::kFloat) - zp.to(at::kFloat).index_select(1, block_of)) * scale.index_select(1, block_of);
  return at::matmul(a.to(at::kFloat), dense.t()).to(a.scalar_type());
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) g_iterations = std::max(5, std::atoi(argv[++i]));
  if (c10::cuda::device_count() == 0) {
    std::fprintf(stderr, "gpu_matmul_nbits_bench: no CUDA device\n");
    return 1;
  }
  Registry registry;
  registry.load({});
  MatMulNBitsKernels* kernels = matmul_nbits_kernels(c10::DeviceType::CUDA);
  if (!kernels) {
    std::fprintf(stderr, "gpu_matmul_nbits_bench: the cuda kernels plugin is not loaded (see `sparsebit plugins`)\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  // Copies of a weight of `bytes` (4-bit) whose sum is at least twice the L2 cache.
  const auto copies_for = [&](double bytes) {
    return int(std::clamp(std::ceil(2.0 * prop.l2CacheSize / bytes), 1.0, 256.0));
  };
  std::printf(
      "%s (L2 %d MiB); one decoder layer of a 1 B-parameter model (60.8 M weights), ms per layer (7 "
      "products)\n\n",
      prop.name, prop.l2CacheSize >> 20);
  std::printf(
      "| activations | groups | rows | 4-bit kernels | dequant kernel + matmul | ATen dequant + matmul | "
      "float matmul | float / 4-bit | 4-bit, graph | float, graph | float / 4-bit, graphs | "
      "weight GB/s (4-bit, graph) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  at::manual_seed(0);
  for (at::ScalarType type : {at::kFloat, at::kHalf})
    for (auto [block, zero_points] : {std::pair<std::int64_t, bool>{32, true}, {128, false}}) {
      double bytes = 0;  // of one layer's 4-bit weights
      for (const auto& p : kLayer) {
        const std::int64_t blocks = (p.k + block - 1) / block;
        bytes += double(p.n * blocks * (block / 2 + (type == at::kHalf ? 2 : 4)) +
                        (zero_points ? p.n * ((blocks + 1) / 2) : 0));
      }
      const int copies = copies_for(bytes);
      std::vector<Weight> layers;  // `copies` layers, one after the other
      for (int c = 0; c < copies; ++c)
        for (const auto& p : kLayer) layers.push_back(make(p, block, zero_points, type));
      for (std::int64_t rows : {1, 2, 4, 8, 16, 128, 512}) {
        std::vector<at::Tensor> xs;
        for (const auto& p : kLayer)
          xs.push_back(at::randn({rows, p.k}, at::TensorOptions().device(at::kCUDA)).to(type));
        auto all = [&](const std::function<at::Tensor(const at::Tensor&, Weight&)>& f) {
          return [&layers, &xs, f] {
            for (std::size_t i = 0; i < layers.size(); ++i) f(xs[i % xs.size()], layers[i]);
          };
        };
        auto run = [&](const std::function<at::Tensor(const at::Tensor&, Weight&)>& f) {
          return median_ms(all(f)) / copies;
        };
        const auto nbits = [&](const at::Tensor& x, Weight& w) {
          MatMulNBitsArgs a = w.args;
          a.a = x;
          return kernels->matmul_nbits(a);
        };
        const auto float_product = [](const at::Tensor& x, Weight& w) { return at::matmul(x, w.dense_t); };
        const double ours = run(nbits);
        const double ours_graph = graph_ms(all(nbits)) / copies;
        const double dense_graph = graph_ms(all(float_product)) / copies;
        // Our dequantization kernel + cuBLAS at every row count: what the decode kernels do not
        // take goes this way.
        const double dequant = run([&](const at::Tensor& x, Weight& w) {
          const MatMulNBitsArgs& a = w.args;
          const cuda::Nbits4Weight nw{a.b.data_ptr<std::uint8_t>(),
                                      a.scales.data_ptr(),
                                      a.zero_points.defined() ? a.zero_points.data_ptr<std::uint8_t>() : nullptr,
                                      a.n,
                                      a.k,
                                      a.block_size};
          at::Tensor dense = at::empty({a.n, a.k}, x.options());
          cuda::dequantize_nbits4(nw, type == at::kHalf, dense.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
          return at::matmul(x, dense.t());
        });
        const double aten = run([&](const at::Tensor& x, Weight& w) { return aten_dequant_matmul(x, w.args); });
        const double dense = run(float_product);
        std::printf("| %s | %lld%s | %lld | %.4f | %.4f | %.4f | %.4f | %.2fx | %.4f | %.4f | %.2fx | %.0f |\n",
                    type == at::kFloat ? "float32" : "float16", static_cast<long long>(block),
                    zero_points ? " + zp" : "", static_cast<long long>(rows), ours, dequant, aten, dense, dense / ours,
                    ours_graph, dense_graph, dense_graph / ours_graph, bytes / (ours_graph * 1e-3) / 1e9);
        std::fflush(stdout);
      }
    }
  // Each projection alone at one row (groups of 128, no zero points), from CUDA graphs.
  const std::vector<Projection> seven_b = {
      {"7B q/k/v/o", 4096, 4096}, {"7B gate/up", 4096, 11008}, {"7B down", 11008, 4096}};
  std::vector<Projection> projections = kLayer;
  projections.insert(projections.end(), seven_b.begin(), seven_b.end());
  std::printf(
      "\nOne row, each projection alone (groups of 128), CUDA graphs, ms per product\n\n| activations | projection | "
      "K x N | 4-bit kernel | float matmul | float / 4-bit | weight GB/s (4-bit) "
      "|\n|---|---|---|---:|---:|---:|---:|\n");
  for (at::ScalarType type : {at::kFloat, at::kHalf})
    for (const auto& p : projections) {
      const double bytes = double(p.n * (p.k / 2 + (p.k / 128) * (type == at::kHalf ? 2 : 4)));
      const int copies = copies_for(bytes);
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(make(p, 128, false, type));
      const at::Tensor x = at::randn({1, p.k}, at::TensorOptions().device(at::kCUDA)).to(type);
      const double ours = graph_ms([&] {
                            for (Weight& w : ws) {
                              MatMulNBitsArgs a = w.args;
                              a.a = x;
                              kernels->matmul_nbits(a);
                            }
                          }) /
                          copies;
      const double dense = graph_ms([&] {
                             for (Weight& w : ws) at::matmul(x, w.dense_t);
                           }) /
                           copies;
      std::printf("| %s | %s | %lld x %lld | %.4f | %.4f | %.2fx | %.0f |\n",
                  type == at::kFloat ? "float32" : "float16", p.name, static_cast<long long>(p.k),
                  static_cast<long long>(p.n), ours, dense, dense / ours, bytes / (ours * 1e-3) / 1e9);
      std::fflush(stdout);
    }
  return 0;
}
