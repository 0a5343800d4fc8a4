// The learnable quantizers against their papers' gradients (closed forms per element, and
// finite differences where the method's gradient is the true derivative of its clip), their
// initialisations, and export.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

std::unique_ptr<Quantizer> make(const std::string& name, const QSpec& spec, const Options& options = Options("[test]")) {
  const auto* e = testing::shipped_registry().quantizer(name);
  if (!e) throw Error("quantizer " + name + " not loaded");
  return e->factory(QuantizerContext{spec, options, "test tensor"});
}

QParams per_tensor(double scale, int zp) {
  return {at::scalar_tensor(scale, at::kFloat), at::scalar_tensor(zp, at::TensorOptions().dtype(at::kInt))};
}

TEST(Quantizers, LsqForwardIsUniformAndItsScaleGradientIsThePapers) {
  QSpec s;  // int8 symmetric
  auto q = make("lsq", s);
  const double scale = 0.05;
  q->initialize(per_tensor(scale, 0));
  at::manual_seed(5);
  at::Tensor x = (at::randn({1000}) * 3).set_requires_grad(true);
  at::Tensor y = q->forward(x);
  EXPECT_TRUE(at::equal(y.detach(), fake_quantize(x.detach(), per_tensor(scale, 0), s)));
  y.sum().backward();
  // dy/ds per element: round(x/s) - x/s inside, qmin or qmax outside; scaled by 1/sqrt(N qmax).
  at::Tensor v = x.detach() / scale;
  at::Tensor inside = (v >= -128) & (v <= 127);
  at::Tensor per_elem = at::where(inside, at::round(v) - v, at::where(v < 0, at::full_like(v, -128), at::full_like(v, 127)));
  const double expected = per_elem.sum().item<double>() / std::sqrt(1000.0 * 127);
  EXPECT_NEAR(q->parameters()[0].grad().item<double>(), expected, 1e-4 * std::abs(expected) + 1e-6);
  EXPECT_TRUE(at::equal(x.grad(), inside.to(at::kFloat)));  // straight through inside, 0 outside
}

TEST(Quantizers, LsqPaperInitialisationOnFirstForward) {
  QSpec s;
  Options o("[test]");
  o.set("init", std::string("lsq"));
  auto q = make("lsq", s, o);
  q->initialize(per_tensor(1.0, 0));
  at::Tensor x = at::tensor({-2.0f, 1.0f, 3.0f, -2.0f});
  q->forward(x);
  EXPECT_NEAR(q->qparams().scale.item<double>(), 2 * 2.0 / std::sqrt(127.0), 1e-6);  // 2 mean|x| / sqrt(qmax)
  Options bad("[test]");
  bad.set("init", std::string("random"));
  EXPECT_THROW(make("lsq", s, bad), Error);
}

TEST(Quantizers, LsqPlusOffsetGradientAndExportedZeroPoint) {
  QSpec s;
  s.symmetric = false;  // activations: affine with a learnable offset
  auto q = make("lsq_plus", s);
  q->initialize(per_tensor(0.1, 20));  // beta = -20 * 0.1 = -2
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
  auto q = make("lsq_plus", s);
  at::Tensor w = at::tensor({1.0f, -1.0f, 1.0f, -1.0f, 2.0f, 2.0f, 2.0f, 2.0f}).reshape({2, 4});
  q->initialize({at::ones({2}), at::zeros({2}, at::TensorOptions().dtype(at::kInt))});
  q->forward(w);
  at::Tensor scale = q->qparams().scale;
  EXPECT_NEAR(scale[0].item<double>(), 3.0 / 128, 1e-6);  // mean 0, std 1: max(|-3|, |3|) / 2^7
  EXPECT_NEAR(scale[1].item<double>(), 2.0 / 128, 1e-6);  // mean 2, std 0
}

TEST(Quantizers, PactClipGradientMatchesFiniteDifferences) {
  QSpec s;
  s.symmetric = false;  // [0, alpha]
  Options o("[test]");
  o.set("alpha", 2.0);
  auto q = make("pact", s, o);
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
  EXPECT_THROW(make("pact", w), Error);
}

TEST(Quantizers, DorefaWeightsLieOnTheirGridAndExportAsFloats) {
  QSpec s;
  s.is_weight = true;
  s.bits = 2;
  auto q = make("dorefa", s);
  at::manual_seed(9);
  at::Tensor w = at::randn({64});
  at::Tensor y = q->forward(w);
  // 2 bits: w_q in {-1, -1/3, 1/3, 1}.
  at::Tensor grid = at::tensor({-1.0f, -1.0f / 3, 1.0f / 3, 1.0f});
  at::Tensor dist = std::get<0>((y.unsqueeze(1) - grid.unsqueeze(0)).abs().min(1));
  EXPECT_LT(dist.max().item<float>(), 1e-6);
  EXPECT_FALSE(q->affine_grid());

  Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
  c.backend = "virtual";
  c.w.quantizer = "dorefa";
  c.calibration.count = 16;
  QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", qm.graph().inputs);
  qm.calibrate(*data);
  Graph g = qm.export_graph();
  const Node* conv = g.find_node("/conv2/Conv");
  ASSERT_TRUE(conv);
  at::Tensor exported = g.initializers.at(conv->inputs[1]);
  const QuantSlot* slot = nullptr;
  for (const auto& sl : qm.slots())
    if (sl.node_name == "/conv2/Conv" && sl.role == InputRole::kWeight) slot = &sl;
  ASSERT_TRUE(slot);
  at::Tensor simulated = slot->quantizer->forward(qm.executor().constants().at(slot->tensor));
  EXPECT_TRUE(at::equal(exported, simulated.detach()));
}

TEST(Quantizers, LsqModelTrainsThroughTheQuantModel) {
  // QAT plumbing: parameters() of every quantizer receive gradients through the executor.
  Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
  c.w.quantizer = "lsq";
  c.a.quantizer = "lsq";
  c.calibration.count = 32;
  QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", qm.graph().inputs);
  qm.calibrate(*data);
  qm.set_quant(true, true);
  at::Tensor x = read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 16).to(at::kFloat).div(255).unsqueeze(1);
  qm.forward({x})[0].pow(2).mean().backward();
  int with_grad = 0, params = 0;
  for (const auto& s : qm.slots()) {
    if (s.fake_fused || s.role == InputRole::kBias) continue;
    for (auto& p : s.quantizer->parameters()) {
      ++params;
      with_grad += p.grad().defined() && p.grad().abs().sum().item<double>() > 0;
    }
  }
  EXPECT_GT(params, 10);
  EXPECT_EQ(with_grad, params);
}

}  // namespace
}  // namespace sparsebit
