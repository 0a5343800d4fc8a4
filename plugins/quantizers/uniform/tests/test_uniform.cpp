// uniform as the host drives it (initialize from the observer, forward, qparams) against torch's
// own fake quantization: per tensor and per channel, affine and symmetric, and its gradient.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sparsebit/sdk/testing.h"

namespace sparsebit::testing {
namespace {

// The plugin these tests are for, as built (Note [Plugin test kit]).
const PluginUnderTest& plugin() {
  static const PluginUnderTest built(SPARSEBIT_PLUGIN_FILE);
  return built;
}

// Power-of-two scales: x / s and torch's x * (1 / s) are both exact, so the two agree on every
// element, ties included.
TEST(Quantizers, UniformIsTorchsFakeQuantizationPerTensor) {
  at::manual_seed(11);
  const at::Tensor x = at::cat({at::randn({4096}) * 6, (at::arange(-200, 200).to(at::kFloat) + 0.5) * 0.0625});
  for (auto [symmetric, zp] : {std::pair{true, 0}, std::pair{false, 100}}) {
    QSpec s;
    s.symmetric = symmetric;
    auto q = plugin().quantizer("uniform", s);
    q->initialize(per_tensor_qparams(0.0625, zp));
    const at::Tensor ref = at::fake_quantize_per_tensor_affine(x, 0.0625, zp, s.qmin(), s.qmax());
    EXPECT_TRUE(at::equal(q->forward(x), ref)) << (symmetric ? "symmetric" : "affine");
    EXPECT_EQ(q->qparams().scale.item<double>(), 0.0625);
    EXPECT_EQ(q->qparams().zero_point.item<int>(), zp);
  }
}

TEST(Quantizers, UniformIsTorchsFakeQuantizationPerChannel) {
  at::manual_seed(12);
  const at::Tensor w = at::randn({8, 4, 3, 3});
  QSpec s;
  s.per_channel = true;
  s.channel_axis = 0;
  s.is_weight = true;
  const at::Tensor scale = at::pow(2.0, -at::randint(3, 8, {8}).to(at::kFloat));
  const at::Tensor zp = at::zeros({8}, at::TensorOptions().dtype(at::kInt));
  auto q = plugin().quantizer("uniform", s);
  q->initialize({scale, zp});
  EXPECT_TRUE(at::equal(q->forward(w), at::fake_quantize_per_channel_affine(w, scale, zp, 0, s.qmin(), s.qmax())));
}

// Straight through inside the clamp range, zero outside: torch's gradient, element for element;
// the quantizer itself trains nothing.
TEST(Quantizers, UniformGradientIsStraightThroughInsideTheRange) {
  at::manual_seed(13);
  const at::Tensor base = at::randn({2048}) * 4;
  at::Tensor a = base.clone().set_requires_grad(true), b = base.clone().set_requires_grad(true);
  QSpec s;
  auto q = plugin().quantizer("uniform", s);
  q->initialize(per_tensor_qparams(0.015625, 0));
  q->forward(a).sum().backward();
  at::fake_quantize_per_tensor_affine(b, 0.015625, 0, -128, 127).sum().backward();
  EXPECT_TRUE(at::equal(a.grad(), b.grad()));
  const double inside = a.grad().sum().item<double>();
  EXPECT_GT(inside, 100);   // some elements inside the range
  EXPECT_LT(inside, 2048);  // and some clipped
  EXPECT_TRUE(q->parameters().empty());
}

TEST(Quantizers, UniformBeforeCalibrationNamesTheTensor) {
  auto q = plugin().quantizer("uniform", QSpec{});
  const std::string e = thrown_message([&] { q->forward(at::ones({4})); });
  EXPECT_NE(e.find("test tensor"), std::string::npos) << e;
  EXPECT_NE(e.find("before calibration"), std::string::npos) << e;
}

}  // namespace
}  // namespace sparsebit::testing
