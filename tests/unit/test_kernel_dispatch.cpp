// The host side of device kernels (Note [Device kernels]), checked on the CPU: a QuantKernels
// written as plain loops over Note [Parameter layout] is installed for CPU tensors, and every
// SDK function must route to it, wire its gradients into autograd, shape its parameter
// gradients like the parameters, and agree with the ATen reference it replaces.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {
namespace {

// Element e of a contiguous x -> its parameter, straight from the Note's formula.
std::int64_t param_of(std::int64_t e, const ParamLayout& l) {
  const std::int64_t i = e % l.inner, k = (e / l.inner) % l.n, o = e / (l.inner * l.n);
  switch (l.kind) {
    case ParamLayout::Kind::kTensor: return 0;
    case ParamLayout::Kind::kChannel: return k;
    case ParamLayout::Kind::kGroup: return (o * ((l.n + l.group - 1) / l.group) + k / l.group) * l.inner + i;
  }
  return 0;
}

class LoopKernels final : public QuantKernels {
 public:
  std::map<std::string, int> calls;
  std::string describe() const override { return "scalar loops (test)"; }

  at::Tensor fake_quantize(const QuantArgs& a) override {
    ++calls["fake_quantize"];
    return map(a, [&](float x, float s, float z) {
      const float q = std::clamp(std::nearbyint(x / s) + z, float(a.qmin), float(a.qmax));
      return (q - z) * s;
    });
  }
  at::Tensor fake_quantize_backward(const at::Tensor& grad, const QuantArgs& a) override {
    ++calls["fake_quantize_backward"];
    at::Tensor inside = map(a, [&](float x, float s, float z) {
      const float q = std::nearbyint(x / s) + z;
      return q >= float(a.qmin) && q <= float(a.qmax) ? 1.0f : 0.0f;
    });
    return grad * inside;
  }
  at::Tensor quantize_to_int(const QuantArgs& a) override {
    ++calls["quantize_to_int"];
    return map(a,
               [&](float x, float s, float z) {
                 return float(std::clamp<std::int64_t>(std::int64_t(std::nearbyint(x / s) + z), a.qmin, a.qmax));
               })
        .to(at::kInt);
  }
  at::Tensor lsq_forward(const QuantArgs& a) override {
    ++calls["lsq_forward"];
    return map(a, [&](float x, float s, float z) {
      const float v = std::clamp(x / s + z, float(a.qmin), float(a.qmax));
      return (std::nearbyint(v) - z) * s;
    });
  }
  std::tuple<at::Tensor, at::Tensor, at::Tensor> lsq_backward(const at::Tensor& grad, const QuantArgs& a) override {
    ++calls["lsq_backward"];
    at::Tensor gx = at::empty_like(a.x), gs = at::zeros({a.layout.params()}), gz = at::zeros({a.layout.params()});
    const float *x = a.x.data_ptr<float>(), *g = grad.contiguous().data_ptr<float>();
    const float *s = a.scale.data_ptr<float>(), *z = a.zero_point.data_ptr<float>();
    for (std::int64_t e = 0; e < a.x.numel(); ++e) {
      const std::int64_t p = param_of(e, a.layout);
      const float u = x[e] / s[p] + z[p];
      const bool inside = u >= float(a.qmin) && u <= float(a.qmax);
      gx.data_ptr<float>()[e] = inside ? g[e] : 0.0f;
      gs.data_ptr<float>()[p] +=
          g[e] * (inside ? std::nearbyint(u) - z[p] - x[e] / s[p] : std::clamp(u, float(a.qmin), float(a.qmax)) - z[p]);
      gz.data_ptr<float>()[p] += inside ? 0.0f : -g[e] * s[p];
    }
    return {gx, gs, gz};
  }
  at::Tensor soft_round_forward(const QuantArgs& a, const at::Tensor& v, double zeta, double gamma) override {
    ++calls["soft_round_forward"];
    const float* vp = v.data_ptr<float>();
    std::int64_t e = 0;
    return map(a, [&](float x, float s, float z) {
      const float h =
          std::clamp(float(1 / (1 + std::exp(-double(vp[e++])))) * float(zeta - gamma) + float(gamma), 0.0f, 1.0f);
      const float q = std::clamp(std::floor(x / s) + h + z, float(a.qmin), float(a.qmax));
      return (q - z) * s;
    });
  }
  at::Tensor soft_round_backward(const at::Tensor& grad, const QuantArgs& a, const at::Tensor& v, double zeta,
                                 double gamma) override {
    ++calls["soft_round_backward"];
    const float *vp = v.data_ptr<float>(), *g = grad.contiguous().data_ptr<float>();
    std::int64_t e = 0;
    return map(a, [&](float x, float s, float z) {
      const float sig = float(1 / (1 + std::exp(-double(vp[e]))));
      const float pre = sig * float(zeta - gamma) + float(gamma);
      const float q = std::floor(x / s) + std::clamp(pre, 0.0f, 1.0f) + z;
      const bool pass = pre >= 0 && pre <= 1 && q >= float(a.qmin) && q <= float(a.qmax);
      const float out = pass ? g[e] * s * float(zeta - gamma) * sig * (1 - sig) : 0.0f;
      ++e;
      return out;
    });
  }
  std::pair<at::Tensor, at::Tensor> range_per_param(const at::Tensor& x, const ParamLayout& l) override {
    ++calls["range_per_param"];
    at::Tensor lo = at::full({l.params()}, std::numeric_limits<float>::infinity());
    at::Tensor hi = at::full({l.params()}, -std::numeric_limits<float>::infinity());
    for (std::int64_t e = 0; e < x.numel(); ++e) {
      const std::int64_t p = param_of(e, l);
      lo.data_ptr<float>()[p] = std::min(lo.data_ptr<float>()[p], x.data_ptr<float>()[e]);
      hi.data_ptr<float>()[p] = std::max(hi.data_ptr<float>()[p], x.data_ptr<float>()[e]);
    }
    return {lo, hi};
  }
  at::Tensor histogram_counts(const at::Tensor& rows, double range, std::int64_t bins) override {
    ++calls["histogram_counts"];
    at::Tensor counts = at::zeros({rows.size(0), bins}, at::kLong);
    const double width = 2 * range / double(bins);
    for (std::int64_t r = 0; r < rows.size(0); ++r)
      for (std::int64_t c = 0; c < rows.size(1); ++c) {
        const double t = std::floor((double(rows[r][c].item<float>()) + range) / width);
        counts[r][std::int64_t(std::clamp(t, 0.0, double(bins - 1)))] += 1;
      }
    return counts;
  }

 private:
  template <class F>
  at::Tensor map(const QuantArgs& a, F f) {
    at::Tensor y = at::empty_like(a.x);
    const float *x = a.x.data_ptr<float>(), *s = a.scale.data_ptr<float>(), *z = a.zero_point.data_ptr<float>();
    for (std::int64_t e = 0; e < a.x.numel(); ++e) {
      const std::int64_t p = param_of(e, a.layout);
      y.data_ptr<float>()[e] = f(x[e], s[p], z[p]);
    }
    return y;
  }
};

QSpec spec_of(int bits, bool symmetric, bool per_channel, std::int64_t axis, std::int64_t group = 0) {
  QSpec s;
  s.bits = bits;
  s.symmetric = symmetric;
  s.per_channel = per_channel;
  s.channel_axis = axis;
  s.group_size = group;
  s.group_axis = axis;
  return s;
}

class KernelDispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    auto k = std::make_shared<LoopKernels>();
    kernels = k.get();
    install_quant_kernels(c10::DeviceType::CPU, k, "test");
    use_device_kernels(true);
  }
  void TearDown() override { install_quant_kernels(c10::DeviceType::CPU, nullptr, "test"); }
  LoopKernels* kernels = nullptr;

  // The ATen reference for the same call.
  template <class F>
  auto reference(F f) {
    use_device_kernels(false);
    auto r = f();
    use_device_kernels(true);
    return r;
  }
};

struct Case {
  std::vector<std::int64_t> shape;
  QSpec spec;
};
std::vector<Case> cases() {
  return {{{2, 3, 4, 5}, spec_of(8, true, false, 0)},
          {{2, 3, 4, 5}, spec_of(8, false, true, 1)},
          {{6, 3, 2}, spec_of(4, true, true, -1)},
          {{6, 10}, spec_of(4, true, false, 1, 4)},
          {{9, 5, 3}, spec_of(4, false, false, 0, 4)}};
}

QParams params_for(const at::Tensor& x, const QSpec& spec) {
  auto [lo, hi] = range_per_param(x, spec);
  return qparams_from_range(lo, hi, spec, "test");
}

TEST(ParamLayoutTest, ViewsAroundTheAxis) {
  const at::Tensor x = at::zeros({2, 3, 4, 5});
  ParamLayout l = param_layout(x, spec_of(8, true, true, 1));
  EXPECT_EQ(l.kind, ParamLayout::Kind::kChannel);
  EXPECT_EQ(l.outer, 2);
  EXPECT_EQ(l.n, 3);
  EXPECT_EQ(l.inner, 20);
  EXPECT_EQ(l.params(), 3);
  l = param_layout(x, spec_of(8, true, false, 0));
  EXPECT_EQ(l.params(), 1);
  EXPECT_EQ(l.n, 120);
  l = param_layout(at::zeros({6, 10}), spec_of(4, true, false, 1, 4));
  EXPECT_EQ(l.kind, ParamLayout::Kind::kGroup);
  EXPECT_EQ(l.params(), 18);  // 6 rows x ceil(10 / 4) blocks
  EXPECT_THROW(param_layout(x, spec_of(8, true, true, 4)), Error);
}

TEST(RangePerParam, RaggedLastGroupCoversItsRealElementsOnly) {
  // Blocks of 4 along axis 1: {-1, 2, 3, 4} and {5}; by hand, not 0 for the padded block.
  const at::Tensor x = at::tensor({-1.f, 2.f, 3.f, 4.f, 5.f, 0.5f, -6.f, 1.f, 2.f, -3.f}).reshape({2, 5});
  auto [lo, hi] = range_per_param(x, spec_of(4, true, false, 1, 4));
  ASSERT_EQ(lo.sizes(), (std::vector<std::int64_t>{2, 2}));
  EXPECT_TRUE(at::equal(lo, at::tensor({-1.f, 5.f, -6.f, -3.f}).reshape({2, 2})));
  EXPECT_TRUE(at::equal(hi, at::tensor({4.f, 5.f, 2.f, -3.f}).reshape({2, 2})));
  EXPECT_THROW(range_per_param(x, spec_of(8, true, true, 2)), Error);
}

TEST_F(KernelDispatch, FakeQuantizeAndIntegersRouteToTheKernels) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.spec.describe());
    at::manual_seed(0);
    const at::Tensor x = at::randn(c.shape) * 2;
    const QParams p = params_for(x, c.spec);
    const int before = kernels->calls["fake_quantize"];
    const at::Tensor y = fake_quantize(x, p, c.spec);
    EXPECT_EQ(kernels->calls["fake_quantize"], before + 1);
    EXPECT_TRUE(at::equal(y, reference([&] { return fake_quantize(x, p, c.spec); })));
    EXPECT_TRUE(at::equal(quantize_to_int(x, p, c.spec), reference([&] { return quantize_to_int(x, p, c.spec); })));
  }
}

TEST_F(KernelDispatch, StraightThroughGradientGoesThroughTheKernel) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.spec.describe());
    at::manual_seed(1);
    const at::Tensor x0 = at::randn(c.shape) * 2;
    QParams p = params_for(x0, c.spec);
    p.scale = p.scale * 0.5;  // clips
    const at::Tensor g = at::randn(c.shape);
    at::Tensor x = x0.clone().set_requires_grad(true);
    fake_quantize(x, p, c.spec).backward(g);
    EXPECT_GE(kernels->calls["fake_quantize_backward"], 1);
    at::Tensor xr = x0.clone().set_requires_grad(true);
    reference([&] {
      fake_quantize(xr, p, c.spec).backward(g);
      return 0;
    });
    EXPECT_TRUE(at::equal(x.grad(), xr.grad()));
    EXPECT_GT((x.grad() == 0).sum().item<std::int64_t>(), 0);
  }
}

TEST_F(KernelDispatch, LsqGradientsHaveTheParametersShapes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.spec.describe());
    at::manual_seed(2);
    const at::Tensor x0 = at::randn(c.shape) * 2;
    const QParams p = params_for(x0, c.spec);
    const at::Tensor g = at::randn(c.shape);
    auto run = [&] {
      at::Tensor x = x0.clone().set_requires_grad(true);
      at::Tensor s = (p.scale * 0.6).clone().set_requires_grad(true);
      at::Tensor z = p.zero_point.to(at::kFloat).clone().set_requires_grad(true);
      at::Tensor y = lsq_fake_quantize(x, s, z, c.spec);
      y.backward(g);
      return std::vector<at::Tensor>{y.detach(), x.grad(), s.grad(), z.grad()};
    };
    const auto got = run();
    EXPECT_EQ(kernels->calls["lsq_backward"], kernels->calls["lsq_forward"]);
    const auto ref = reference(run);
    EXPECT_TRUE(at::equal(got[0], ref[0]));
    EXPECT_TRUE(at::allclose(got[1], ref[1], 1e-6, 1e-6));
    ASSERT_EQ(got[2].sizes(), p.scale.sizes());
    ASSERT_EQ(got[3].sizes(), p.zero_point.sizes());
    EXPECT_TRUE(at::allclose(got[2], ref[2], 1e-4, 1e-4)) << got[2] << ref[2];
    EXPECT_TRUE(at::allclose(got[3], ref[3], 1e-4, 1e-4)) << got[3] << ref[3];
  }
  EXPECT_GT(kernels->calls["lsq_forward"], 0);
  // A zero point that is not trained gets no gradient.
  at::Tensor x = at::randn({4, 5}).set_requires_grad(true);
  at::Tensor s = at::full({}, 0.1f).set_requires_grad(true);
  lsq_fake_quantize(x, s, at::zeros({}), spec_of(8, true, false, 0)).sum().backward();
  EXPECT_TRUE(s.grad().defined());
}

TEST_F(KernelDispatch, SoftRoundingGradientReachesV) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.spec.describe());
    at::manual_seed(3);
    const at::Tensor x = at::randn(c.shape) * 2;
    const QParams p = params_for(x, c.spec);
    const at::Tensor v0 = at::randn(c.shape) * 3, g = at::randn(c.shape);
    auto run = [&] {
      at::Tensor v = v0.clone().set_requires_grad(true);
      at::Tensor y = soft_round_quantize(x, v, p, c.spec, 1.1, -0.1);
      y.backward(g);
      return std::pair<at::Tensor, at::Tensor>{y.detach(), v.grad()};
    };
    const auto [y, gv] = run();
    const auto [yr, gvr] = reference(run);
    EXPECT_TRUE(at::allclose(y, yr, 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(gv, gvr, 1e-4, 1e-6));
  }
  EXPECT_GT(kernels->calls["soft_round_backward"], 0);
}

TEST_F(KernelDispatch, RangesComeBackParameterShaped) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.spec.describe());
    const at::Tensor x = at::randn(c.shape);
    auto [lo, hi] = range_per_param(x, c.spec);
    auto [lr, hr] = reference([&] { return range_per_param(x, c.spec); });
    ASSERT_EQ(lo.sizes(), lr.sizes());
    EXPECT_TRUE(at::equal(lo, lr));
    EXPECT_TRUE(at::equal(hi, hr));
  }
  const at::Tensor rows = at::randn({2, 300});
  EXPECT_TRUE(at::equal(histogram_counts(rows, 2.0, 64), reference([&] { return histogram_counts(rows, 2.0, 64); })));
  EXPECT_EQ(kernels->calls["histogram_counts"], 1);
}

TEST_F(KernelDispatch, OtherTensorsKeepTheReference) {
  const QSpec spec = spec_of(8, true, true, 0);
  const at::Tensor x = at::randn({4, 6});
  const QParams p = params_for(x, spec);
  // Double precision, a scale being trained, a per-channel spec with one shared scale, and the
  // kernels switched off all stay on ATen.
  fake_quantize(x.to(at::kDouble), p, spec);
  QParams trained{p.scale.clone().set_requires_grad(true), p.zero_point};
  fake_quantize(x, trained, spec);
  fake_quantize(x, {p.scale.max(), p.zero_point[0]}, spec);
  use_device_kernels(false);
  EXPECT_EQ(quant_kernels(c10::DeviceType::CPU), nullptr);
  fake_quantize(x, p, spec);
  use_device_kernels(true);
  EXPECT_EQ(kernels->calls["fake_quantize"], 0);
  // A wrong parameter count is the reference's clear error, not a kernel reading past the end.
  EXPECT_THROW(fake_quantize(x, {p.scale.narrow(0, 0, 3), p.zero_point.narrow(0, 0, 3)}, spec), Error);
}

}  // namespace
}  // namespace sparsebit
