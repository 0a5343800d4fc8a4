// On the GPU: the float8 simulation (Note [Float8 elements]) against torch's own float8 casts, and
// the 4-bit MatMulNBits kernels (Note [MatMulNBits kernels]) against a float64 reference on the CPU.
// Skipped without a CUDA device.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>

#include "sparsebit/core/executor.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/quant.h"
#include "sparsebit/sdk/version.h"  // TORCH_VERSION_MAJOR / MINOR
#include "test_support.h"

namespace sparsebit {
namespace {

class OnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (c10::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    testing::shipped_registry();
    use_device_kernels(true);
  }
};

#if !defined(TORCH_VERSION_MAJOR)
#error "the LibTorch version is unknown: the float8 comparison needs torch.float8_e4m3fn (LibTorch 2.1)"
#elif TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
// Bit patterns of y, with every NaN as one pattern (payloads are not part of the format).
at::Tensor bits_of(const at::Tensor& y) { return at::where(at::isnan(y), at::full_like(y, NAN), y).view(at::kInt); }

// torch's cast after clamping to the largest value: the saturating cast round_to_float8 computes.
at::Tensor torch_cast(const at::Tensor& x, QElement e) {
  const double largest = float8_max(e);
  const auto dtype = e == QElement::kFloat8E4M3FN ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  return at::clamp(x, -largest, largest).to(dtype).to(at::kFloat);
}

// Every float32 bit pattern (2^32 values: all finite values of both signs, subnormals,
// infinities, NaNs), in chunks on the GPU; a random 2^24 on the CPU.
TEST_F(OnGpu, Float8RoundingEqualsTorchsCastsOnEveryFloat32) {
  const std::int64_t chunk = std::int64_t{1} << 28;
  for (QElement e : {QElement::kFloat8E4M3FN, QElement::kFloat8E5M2}) {
    std::int64_t differ = 0;
    for (std::int64_t start = 0; start < (std::int64_t{1} << 32); start += chunk) {
      const at::Tensor x = at::arange(start, start + chunk, at::TensorOptions().device(at::kCUDA).dtype(at::kLong))
                               .to(at::kInt)
                               .view(at::kFloat);
      differ += bits_of(round_to_float8(x, e)).ne(bits_of(torch_cast(x, e))).sum().item<std::int64_t>();
    }
    EXPECT_EQ(differ, 0) << element_name(e) << ": of 2^32 float32 values";
    const at::Tensor cpu = at::randint(std::numeric_limits<std::int32_t>::min(),
                                       std::numeric_limits<std::int32_t>::max(), {std::int64_t{1} << 24}, at::kInt)
                               .view(at::kFloat);
    EXPECT_TRUE(at::equal(bits_of(round_to_float8(cpu, e)), bits_of(torch_cast(cpu, e)))) << element_name(e) << " CPU";
    // The codes export writes are torch's bytes too.
    QSpec spec;
    spec.element = e;
    const QParams unit{at::scalar_tensor(1.0f), at::scalar_tensor(0, at::kInt)};
    const at::Tensor finite = at::randn({1 << 20}) * 100;
    const auto dtype = e == QElement::kFloat8E4M3FN ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
    EXPECT_TRUE(at::equal(quantize_to_float8(finite, unit, spec),
                          at::clamp(finite, -float8_max(e), float8_max(e)).to(dtype).view(at::kByte)))
        << element_name(e) << " codes";
  }
}
#endif

// W [n, k] of random codes, scales and (optionally) packed zero points, as MatMulNBits stores it.
struct Weight {
  at::Tensor b, scales, zero_points, dense;  // dense: the float64 W on the CPU
};
Weight make_weight(std::int64_t n, std::int64_t k, std::int64_t block, bool with_zero_points, at::ScalarType type) {
  const std::int64_t blocks = (k + block - 1) / block;
  const at::Tensor codes = at::randint(0, 16, {n, blocks * block}, at::kLong);
  Weight w;
  w.b = (codes.slice(1, 0, codes.size(1), 2) + codes.slice(1, 1, codes.size(1), 2) * 16)
            .to(at::kByte)
            .reshape({n, blocks, block / 2});
  const at::Tensor scales = (at::rand({n, blocks}) * 0.02 + 0.001).to(type);
  w.scales = scales.reshape({-1});
  at::Tensor zp = at::full({n, blocks}, 8, at::kLong);
  if (with_zero_points) {
    zp = at::randint(0, 16, {n, blocks + blocks % 2}, at::kLong);
    w.zero_points = (zp.slice(1, 0, zp.size(1), 2) + zp.slice(1, 1, zp.size(1), 2) * 16).to(at::kByte);
    zp = zp.slice(1, 0, blocks);
  }
  const at::Tensor block_of = at::arange(k, at::kLong).div(block, "floor");
  w.dense = (codes.slice(1, 0, k).to(at::kDouble) - zp.index_select(1, block_of).to(at::kDouble)) *
            scales.to(at::kDouble).index_select(1, block_of);
  return w;
}

TEST_F(OnGpu, MatMulNBitsKernelsEqualTheReference) {
  MatMulNBitsKernels* kernels = matmul_nbits_kernels(c10::DeviceType::CUDA);
  ASSERT_NE(kernels, nullptr) << "the cuda kernels plugin did not load";
  at::manual_seed(4);
  int cases = 0;
  // k = 200: not a multiple of 32 (the dequantize-then-matmul path at any row count); block 16 too.
  // k = 4480: 35 steps of 128 codes, more than one round of the tensor-core kernel's warps, the
  // last round partial.
  // Rows: the decode kernels (float16 on tensor cores up to 16, float32 up to 8) and prefill.
  for (auto [n, k, block] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{96, 256, 32},
                             {512, 2048, 128},
                             {100, 200, 64},
                             {64, 512, 16},
                             {2048, 8192, 64},
                             {48, 4480, 128}})
    for (bool zero_points : {false, true})
      for (at::ScalarType type : {at::kFloat, at::kHalf})
        for (std::int64_t m : {1, 3, 8, 9, 16, 300}) {
          const Weight w = make_weight(n, k, block, zero_points, type);
          const at::Tensor a = at::randn({m, k}).to(type);
          MatMulNBitsArgs args;
          args.a = a.cuda();
          args.b = w.b.cuda();
          args.scales = w.scales.cuda();
          if (w.zero_points.defined()) args.zero_points = w.zero_points.cuda();
          args.k = k;
          args.n = n;
          args.bits = 4;
          args.block_size = block;
          const at::Tensor y = kernels->matmul_nbits(args);
          ASSERT_TRUE(y.defined());
          ASSERT_EQ(y.scalar_type(), type);
          const at::Tensor want = at::matmul(a.to(at::kDouble), w.dense.t());
          const double scale = want.abs().max().item<double>();
          const double err = (y.cpu().to(at::kDouble) - want).abs().max().item<double>() / scale;
          // float32: accumulation order; float16: the output's own rounding (2^-11) and the
          // cuBLAS half product of the prefill path.
          EXPECT_LT(err, type == at::kFloat ? 2e-5 : 4e-3) << "n " << n << " k " << k << " block " << block << " zp "
                                                           << zero_points << " m " << m << " " << c10::toString(type);
          ++cases;
        }
  EXPECT_EQ(cases, 144);
}

// A MatMulNBits node runs through the kernels on the GPU and gives the CPU's (ATen reference)
// output; with the kernels switched off the GPU runs the reference too.
TEST_F(OnGpu, MatMulNBitsNodeOnTheGpuEqualsTheCpu) {
  at::manual_seed(6);
  const std::int64_t n = 256, k = 1024, block = 32;
  const Weight w = make_weight(n, k, block, true, at::kFloat);
  Graph g;
  g.opset_imports[""] = 21;
  g.opset_imports["com.microsoft"] = 1;
  g.inputs.push_back({"a", 1, true, {{-1, ""}, {-1, ""}, {k, ""}}, ""});
  g.outputs.push_back({"y", 1, true, {{-1, ""}, {-1, ""}, {n, ""}}, ""});
  g.initializers["b"] = w.b;
  g.initializers["s"] = w.scales;
  g.initializers["zp"] = w.zero_points;
  g.initializers["bias"] = at::randn({n});
  Node node;
  node.name = "mm";
  node.op_type = "MatMulNBits";
  node.domain = "com.microsoft";
  node.inputs = {"a", "b", "s", "zp", "", "bias"};
  node.outputs = {"y"};
  node.attributes["K"] = Attribute::of_int(k);
  node.attributes["N"] = Attribute::of_int(n);
  node.attributes["bits"] = Attribute::of_int(4);
  node.attributes["block_size"] = Attribute::of_int(block);
  g.append(node);
  for (std::int64_t rows : {1, 64}) {
    const at::Tensor a = at::randn({2, rows, k});
    Executor cpu(g, testing::shipped_registry());
    const at::Tensor want = cpu.run({{"a", a}})[0];
    Executor gpu(g, testing::shipped_registry());
    gpu.to("cuda");
    const at::Tensor got = gpu.run({{"a", a.cuda()}})[0].cpu();
    EXPECT_LT((got - want).abs().max().item<double>(), 2e-5 * want.abs().max().item<double>()) << rows << " rows";
  }
}

}  // namespace
}  // namespace sparsebit
