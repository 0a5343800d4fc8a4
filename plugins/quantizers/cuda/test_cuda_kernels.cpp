// The CUDA kernels against the CPU reference (the ATen arithmetic of sparsebit/sdk/quant.h run on
// the CPU): quantized values and integers bit for bit, gradients to float tolerance. Skipped
// without a CUDA device.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/quant.h"
#include "test_support.h"

namespace sparsebit {
namespace {

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (c10::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    testing::shipped_registry();
    use_device_kernels(true);
    ASSERT_NE(quant_kernels(c10::DeviceType::CUDA), nullptr) << "the cuda kernels plugin did not load";
  }
};

struct Case {
  const char* name;
  std::vector<std::int64_t> shape;
  QSpec spec;
};

QSpec make_spec(int bits, bool symmetric, bool per_channel, std::int64_t axis, std::int64_t group = 0,
                bool narrow = false) {
  QSpec s;
  s.bits = bits;
  s.symmetric = symmetric;
  s.per_channel = per_channel;
  s.channel_axis = axis;
  s.group_size = group;
  s.group_axis = axis;
  s.narrow_range = narrow;
  return s;
}

// Layouts a model meets: per tensor, conv weights per output channel, activations per channel
// (axis 1), channels last (inner = 1), per group along either axis with a ragged last block;
// element counts that are not a multiple of 4.
std::vector<Case> cases() {
  return {
      {"tensor_int8_sym", {8, 16, 7, 5}, make_spec(8, true, false, 0)},
      {"tensor_uint8_affine", {3, 1001}, make_spec(8, false, false, 0)},
      {"conv_weight_axis0_int4", {64, 32, 3, 3}, make_spec(4, true, true, 0)},
      {"activation_axis1", {8, 16, 7, 5}, make_spec(8, false, true, 1)},
      {"channels_last", {6, 9, 10}, make_spec(8, true, true, -1, 0, true)},
      {"group_axis1_ragged", {96, 200}, make_spec(4, true, false, 1, 32)},
      {"group_axis0", {130, 24}, make_spec(4, false, false, 0, 64)},
      {"large_per_channel", {512, 2048, 3}, make_spec(8, true, true, 0)},
      {"bias_int32", {1000}, make_spec(32, true, false, 0)},
  };
}

// Parameters from the observed range, as calibration makes them.
QParams params_for(const at::Tensor& x, const QSpec& spec) {
  auto [lo, hi] = range_per_param(x.cpu(), spec);
  return qparams_from_range(lo, hi, spec, "test");
}

at::Tensor data(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn(shape) * 3;
  // Exact halves of the step and values beyond the range exercise rounding and clamping.
  const std::int64_t k = std::min<std::int64_t>(x.numel(), 7);
  x.view({-1}).narrow(0, 0, k).copy_(at::tensor({0.5, 1.5, 2.5, -0.5, -2.5, 40., -40.}).narrow(0, 0, k));
  return x;
}

QParams to_cuda(const QParams& p) { return {p.scale.cuda(), p.zero_point.cuda()}; }

TEST_F(CudaKernels, FakeQuantizeAndIntegersAreBitExact) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const at::Tensor x = data(c.shape, 1);
    QParams p = params_for(x, c.spec);
    if (c.spec.bits == 32) p.scale = p.scale / 1024;  // a bias scale far below the range: clamps to int32
    const at::Tensor ref = fake_quantize(x, p, c.spec);
    const at::Tensor got = fake_quantize(x.cuda(), to_cuda(p), c.spec).cpu();
    EXPECT_TRUE(at::equal(ref, got)) << "largest difference " << (ref - got).abs().max().item<float>();
    const at::Tensor qref = quantize_to_int(x, p, c.spec);
    const at::Tensor qgot = quantize_to_int(x.cuda(), to_cuda(p), c.spec).cpu();
    EXPECT_TRUE(at::equal(qref, qgot)) << "integers differ at " << (qref != qgot).sum().item<std::int64_t>() << " of "
                                       << x.numel();
    EXPECT_TRUE(at::logical_or(qgot == c.spec.qmin(), qgot == c.spec.qmax()).any().item<bool>())
        << "no value at a bound";
  }
}

TEST_F(CudaKernels, UnalignedAndOddSizedTensors) {
  const QSpec spec = make_spec(8, true, false, 0);
  for (std::int64_t n : {1, 3, 5, 4097}) {
    const at::Tensor base = data({n + 1}, 2).cuda();
    const at::Tensor x = base.narrow(0, 1, n);  // 4 bytes past an aligned start
    const QParams p = params_for(x, spec);
    EXPECT_TRUE(at::equal(fake_quantize(x.cpu(), p, spec), fake_quantize(x, to_cuda(p), spec).cpu())) << n;
  }
}

TEST_F(CudaKernels, StraightThroughGradient) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const at::Tensor x = data(c.shape, 3);
    QParams p = params_for(x, c.spec);
    p.scale = p.scale * 0.5;  // half of the range clips: zero gradient there
    const at::Tensor g = at::randn(c.shape);
    const at::Tensor xc = x.clone().set_requires_grad(true);
    fake_quantize(xc, p, c.spec).backward(g);
    const at::Tensor xg = x.cuda().set_requires_grad(true);
    fake_quantize(xg, to_cuda(p), c.spec).backward(g.cuda());
    EXPECT_TRUE(at::equal(xc.grad(), xg.grad().cpu()));
    if (c.spec.bits < 32) {
      EXPECT_GT((xg.grad() == 0).sum().item<std::int64_t>(), 0) << "nothing clipped";
    }
  }
}

TEST_F(CudaKernels, LsqForwardExactAndGradientsClose) {
  for (const Case& c : cases()) {
    if (c.spec.bits == 32) continue;
    SCOPED_TRACE(c.name);
    const at::Tensor x = data(c.shape, 4);
    const QParams p = params_for(x, c.spec);
    const at::Tensor g = at::randn(c.shape);
    auto run = [&](const at::Device& d) {
      // Fresh leaves per device (x.to(kCPU) would return x itself).
      at::Tensor xd = x.to(d).clone().set_requires_grad(true);
      at::Tensor s = (p.scale * 0.7).to(d).clone().set_requires_grad(true);
      at::Tensor z = p.zero_point.to(d, at::kFloat).clone().set_requires_grad(true);
      at::Tensor y = lsq_fake_quantize(xd, s, z, c.spec);
      y.backward(g.to(d));
      return std::vector<at::Tensor>{y.detach().cpu(), xd.grad().cpu(), s.grad().cpu(), z.grad().cpu()};
    };
    const auto ref = run(at::kCPU), got = run(at::Device(at::kCUDA, 0));
    EXPECT_TRUE(at::equal(ref[0], got[0])) << "forward differs by " << (ref[0] - got[0]).abs().max().item<float>();
    EXPECT_TRUE(at::allclose(ref[1], got[1], 1e-6, 1e-6));
    // Sums over up to 10^6 elements in another order.
    EXPECT_TRUE(at::allclose(ref[2], got[2], 1e-4, 1e-3)) << (ref[2] - got[2]).abs().max().item<float>();
    EXPECT_TRUE(at::allclose(ref[3], got[3], 1e-4, 1e-3)) << (ref[3] - got[3]).abs().max().item<float>();
    EXPECT_GT(ref[2].abs().sum().item<float>(), 0);
  }
}

TEST_F(CudaKernels, SoftRoundingForwardAndBackward) {
  for (const Case& c : cases()) {
    if (c.spec.bits == 32) continue;
    SCOPED_TRACE(c.name);
    const at::Tensor x = data(c.shape, 5);
    const QParams p = params_for(x, c.spec);
    const at::Tensor v = at::randn(c.shape) * 4;  // some h saturate at 0 or 1 (zero gradient)
    const at::Tensor g = at::randn(c.shape);
    auto run = [&](const at::Device& d) {
      at::Tensor vd = v.to(d).clone().set_requires_grad(true);
      at::Tensor y = soft_round_quantize(x.to(d), vd, d.is_cuda() ? to_cuda(p) : p, c.spec, 1.1, -0.1);
      y.backward(g.to(d));
      return std::pair<at::Tensor, at::Tensor>{y.detach().cpu(), vd.grad().cpu()};
    };
    const auto [yr, gr] = run(at::kCPU);
    const auto [yg, gg] = run(at::Device(at::kCUDA, 0));
    // exp() differs by an ulp between CPU and GPU libraries; values are continuous here.
    EXPECT_TRUE(at::allclose(yr, yg, 1e-5, 1e-6)) << (yr - yg).abs().max().item<float>();
    EXPECT_TRUE(at::allclose(gr, gg, 1e-4, 1e-6)) << (gr - gg).abs().max().item<float>();
    EXPECT_GT((gg == 0).sum().item<std::int64_t>(), 0);
    EXPECT_GT((gg != 0).sum().item<std::int64_t>(), 0);
  }
}

TEST_F(CudaKernels, RangePerParameterIsExact) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const at::Tensor x = data(c.shape, 6);
    auto [lr, hr] = range_per_param(x, c.spec);
    auto [lg, hg] = range_per_param(x.cuda(), c.spec);
    EXPECT_TRUE(at::equal(lr, lg.cpu()));
    EXPECT_TRUE(at::equal(hr, hg.cpu()));
  }
}

TEST_F(CudaKernels, RangeReportsNaNPerChannel) {
  const QSpec spec = make_spec(8, true, true, 1);
  at::Tensor x = data({4, 6, 5, 5}, 7);
  x[2][3][1][1] = std::numeric_limits<float>::quiet_NaN();
  auto [lo, hi] = range_per_param(x.cuda(), spec);
  lo = lo.cpu();
  EXPECT_TRUE(std::isnan(lo[3].item<float>()));
  EXPECT_TRUE(std::isnan(hi.cpu()[3].item<float>()));
  EXPECT_EQ(at::isnan(lo).sum().item<std::int64_t>(), 1);
  EXPECT_THROW(qparams_from_range(lo, hi.cpu(), spec, "x"), Error);
}

TEST_F(CudaKernels, HistogramCountsAreExact) {
  for (std::int64_t bins : {2048, 4096, 16384}) {  // shared-memory and global-memory kernels
    SCOPED_TRACE(bins);
    const at::Tensor rows = data({5, 30011}, 8);
    const double range = rows.abs().max().item<double>() * 0.75;  // the tails clamp into the end bins
    const at::Tensor ref = histogram_counts(rows, range, bins);
    const at::Tensor got = histogram_counts(rows.cuda(), range, bins).cpu();
    EXPECT_TRUE(at::equal(ref, got)) << (ref - got).abs().sum().item<std::int64_t>() << " counts differ";
    EXPECT_EQ(got.sum().item<std::int64_t>(), rows.numel());
  }
}

TEST_F(CudaKernels, SwitchingKernelsOffUsesTheReference) {
  use_device_kernels(false);
  EXPECT_EQ(quant_kernels(c10::DeviceType::CUDA), nullptr);
  const QSpec spec = make_spec(8, true, true, 0);
  const at::Tensor x = data({16, 33}, 9);
  const QParams p = params_for(x, spec);
  const at::Tensor aten = fake_quantize(x.cuda(), to_cuda(p), spec).cpu();
  use_device_kernels(true);
  EXPECT_TRUE(at::equal(aten, fake_quantize(x.cuda(), to_cuda(p), spec).cpu()));
}

}  // namespace
}  // namespace sparsebit
