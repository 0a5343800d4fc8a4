// lsq against the paper: uniform forward, the scale gradient per element, its initialisation,
// and training through a QuantModel (every quantizer parameter receives a gradient).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "quantizer_testing.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

TEST(Quantizers, LsqForwardIsUniformAndItsScaleGradientIsThePapers) {
  QSpec s;  // int8 symmetric
  auto q = make_quantizer("lsq", s);
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
  at::Tensor per_elem =
      at::where(inside, at::round(v) - v, at::where(v < 0, at::full_like(v, -128), at::full_like(v, 127)));
  const double expected = per_elem.sum().item<double>() / std::sqrt(1000.0 * 127);
  EXPECT_NEAR(q->parameters()[0].grad().item<double>(), expected, 1e-4 * std::abs(expected) + 1e-6);
  EXPECT_TRUE(at::equal(x.grad(), inside.to(at::kFloat)));  // straight through inside, 0 outside
}

TEST(Quantizers, LsqPaperInitialisationOnFirstForward) {
  QSpec s;
  Options o("[test]");
  o.set("init", std::string("lsq"));
  auto q = make_quantizer("lsq", s, o);
  q->initialize(per_tensor(1.0, 0));
  at::Tensor x = at::tensor({-2.0f, 1.0f, 3.0f, -2.0f});
  q->forward(x);
  EXPECT_NEAR(q->qparams().scale.item<double>(), 2 * 2.0 / std::sqrt(127.0), 1e-6);  // 2 mean|x| / sqrt(qmax)
  Options bad("[test]");
  bad.set("init", std::string("random"));
  EXPECT_THROW(make_quantizer("lsq", s, bad), Error);
}

TEST(Quantizers, LsqModelTrainsThroughTheQuantModel) {
  // QAT plumbing: parameters() of every quantizer receive gradients through the executor.
  Config c = Config::from_file(source_path("configs/w8a8_onnxruntime.toml"));
  c.w.quantizer = "lsq";
  c.a.quantizer = "lsq";
  c.calibration.count = 32;
  // No deployment placement: under ONNX Runtime's, the input after a MaxPool shares the MaxPool
  // input's grid (Note [ONNX Runtime placement]), reads values already on it, and its scale's
  // gradient is exactly 0.
  c.backend = "virtual";
  QuantModel qm(load_onnx(fixture_model()), c, shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", qm.graph().inputs);
  qm.calibrate(*data);
  qm.set_quant(true, true);
  at::Tensor x =
      read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 16).to(at::kFloat).div(255).unsqueeze(1);
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
}  // namespace sparsebit::testing
