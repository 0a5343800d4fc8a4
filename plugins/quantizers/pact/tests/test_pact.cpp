// pact: the clip value's gradient against finite differences.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "sparsebit/sdk/testing.h"

namespace sparsebit::testing {
namespace {

// The plugin these tests are for, as built (Note [Plugin test kit]).
const PluginUnderTest& plugin() {
  static const PluginUnderTest built(SPARSEBIT_PLUGIN_FILE);
  return built;
}

TEST(Quantizers, PactClipGradientMatchesFiniteDifferences) {
  QSpec s;
  s.symmetric = false;  // [0, alpha]
  Options o("[test]");
  o.set("alpha", 2.0);
  auto q = plugin().quantizer("pact", s, o);
  q->initialize({});
  at::Tensor x = at::tensor({-1.0f, 0.3f, 1.1f, 1.99f, 2.5f, 7.0f}).set_requires_grad(true);
  at::Tensor y = q->forward(x);
  // Values on the grid of [0, 2] in 255 steps.
  const double step = 2.0 / 255;
  EXPECT_NEAR(y[2].item<double>(), 140 * step, 1e-6);  // 1.1 / step = 140.25
  EXPECT_FLOAT_EQ(y[5].item<float>(), 2.0f);
  y.sum().backward();
  EXPECT_FLOAT_EQ(q->parameters()[0].grad().item<float>(), 2.0f);  // x >= alpha: 2.5 and 7
  EXPECT_TRUE(at::equal(x.grad(), at::tensor({0.0f, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f})));
  // PACT's alpha gradient is the derivative of its clip: finite differences of sum(clamp(x, 0, a)).
  const double h = 1e-3;
  auto clip_sum = [&](double a) { return at::clamp(x.detach(), 0.0, a).sum().item<double>(); };
  EXPECT_NEAR((clip_sum(2.0 + h) - clip_sum(2.0 - h)) / (2 * h), 2.0, 1e-3);
  QSpec w;
  w.is_weight = true;
  EXPECT_THROW(plugin().quantizer("pact", w), Error);
}

}  // namespace
}  // namespace sparsebit::testing
