// lsq_plus: the offset gradient, the exported zero point, and the weight initialisation.

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

TEST(Quantizers, LsqPlusOffsetGradientAndExportedZeroPoint) {
  QSpec s;
  s.symmetric = false;  // activations: affine with a learnable offset
  auto q = plugin().quantizer("lsq_plus", s);
  q->initialize(per_tensor_qparams(0.1, 20));  // beta = -20 * 0.1 = -2
  at::Tensor x = at::tensor({-5.0f, -1.0f, 0.5f, 3.0f, 40.0f});
  q->forward(x).sum().backward();
  // dy/dbeta: 0 inside the range [-2, 23.5], 1 outside (x = -5 and x = 40).
  at::Tensor beta = q->parameters()[1];
  EXPECT_FLOAT_EQ(beta.grad().item<float>(), 2.0f);
  QParams p = q->qparams();
  EXPECT_EQ(p.zero_point.item<int>(), 20);
  // Once training moves beta off the integer grid, the simulation still is what export writes:
  // the zero point round(-beta / s), used by QuantizeLinear / DequantizeLinear.
  {
    c10::NoGradGuard g;
    beta.add_(0.037);  // -beta / s = 19.63 -> zero point 20
  }
  EXPECT_EQ(q->qparams().zero_point.item<int>(), 20);
  EXPECT_TRUE(at::allclose(q->forward(x).detach(), fake_quantize(x, q->qparams(), s)));
  {
    c10::NoGradGuard g;
    beta.add_(0.03);  // 19.33 -> 19
  }
  EXPECT_EQ(q->qparams().zero_point.item<int>(), 19);
  EXPECT_TRUE(at::allclose(q->forward(x).detach(), fake_quantize(x, q->qparams(), s)));
}

TEST(Quantizers, LsqPlusWeightInitFromMeanAndThreeSigma) {
  QSpec s;
  s.is_weight = true;
  s.per_channel = true;
  auto q = plugin().quantizer("lsq_plus", s);
  at::Tensor w = at::tensor({1.0f, -1.0f, 1.0f, -1.0f, 2.0f, 2.0f, 2.0f, 2.0f}).reshape({2, 4});
  q->initialize({at::ones({2}), at::zeros({2}, at::TensorOptions().dtype(at::kInt))});
  q->forward(w);
  at::Tensor scale = q->qparams().scale;
  EXPECT_NEAR(scale[0].item<double>(), 3.0 / 128, 1e-6);  // mean 0, std 1: max(|-3|, |3|) / 2^7
  EXPECT_NEAR(scale[1].item<double>(), 2.0 / 128, 1e-6);  // mean 2, std 0
}

}  // namespace
}  // namespace sparsebit::testing
