// AdaRound: soft rounding and regularizer against hand values, hard rounding, option checks,
// and single-layer reconstruction against round to nearest, with its integers exported.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "reconstruction_testing.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::testing {
namespace {

std::unique_ptr<Quantizer> make_adaround(const QSpec& spec, const Options& options) {
  const auto* e = shipped_registry().quantizer("adaround");
  if (!e) throw Error("quantizer adaround not loaded");
  return e->factory(QuantizerContext{spec, options, "test weight"});
}

QSpec int4_weight() {
  QSpec s;
  s.bits = 4;
  s.is_weight = true;
  return s;
}

QParams per_tensor(double scale) {
  return {at::scalar_tensor(scale, at::kFloat), at::scalar_tensor(0, at::TensorOptions().dtype(at::kInt))};
}

// w / s = [0.6, -1.6, 2.2, 7.8]: floor [0, -2, 2, 7], fractional parts [0.6, 0.4, 0.2, 0.8].
const at::Tensor kWeight = at::tensor({0.3f, -0.8f, 1.1f, 3.9f});

TEST(AdaRound, SoftRoundingStartsAtTheFloatWeight) {
  Options o("[w.quantizer_options]");
  auto q = make_adaround(int4_weight(), o);
  q->initialize(per_tensor(0.5));
  // Before reconstruction: round to nearest, half to even.
  EXPECT_TRUE(at::allclose(q->forward(kWeight), at::tensor({0.5f, -1.0f, 1.0f, 3.5f})));
  role<ReconstructedByLayer>(q).begin_reconstruction(kWeight);
  ASSERT_EQ(q->parameters().size(), 1u);
  // V = -log((zeta - gamma) / (rest - gamma) - 1), so that h(V) = rest.
  const std::vector<double> rest = {0.6, 0.4, 0.2, 0.8};
  const at::Tensor v = q->parameters()[0];
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(v[i].item<double>(), -std::log(1.2 / (rest[i] + 0.1) - 1), 1e-5);
  // The soft weight equals the float weight, except 3.9 which is clamped at qmax 7 * 0.5.
  EXPECT_TRUE(at::allclose(q->forward(kWeight), at::tensor({0.3f, -0.8f, 1.1f, 3.5f}), 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(q->qparams().scale, per_tensor(0.5).scale));  // the scale is not learnt
}

TEST(AdaRound, RegularizerFollowsWarmUpAndBetaSchedule) {
  Options o("[w.quantizer_options]");
  o.set("iterations", std::int64_t{100});
  o.set("lambda", 0.01);
  auto q = make_adaround(int4_weight(), o);
  q->initialize(per_tensor(0.5));
  role<ReconstructedByLayer>(q).begin_reconstruction(kWeight);
  // lambda * sum(1 - |2h - 1|^beta) with h = [0.6, 0.4, 0.2, 0.8]: |2h - 1| = [0.2, 0.2, 0.6, 0.6].
  auto expected = [](double beta) { return 0.01 * (2 * (1 - std::pow(0.2, beta)) + 2 * (1 - std::pow(0.6, beta))); };
  EXPECT_EQ(role<ReconstructedByLayer>(q).reconstruction_penalty(0).item<double>(), 0.0);  // warm-up: first 20 steps
  EXPECT_EQ(role<ReconstructedByLayer>(q).reconstruction_penalty(19).item<double>(), 0.0);
  EXPECT_NEAR(role<ReconstructedByLayer>(q).reconstruction_penalty(20).item<double>(), expected(20),
              1e-7);  // beta starts at 20
  EXPECT_NEAR(role<ReconstructedByLayer>(q).reconstruction_penalty(60).item<double>(), expected(11),
              1e-7);  // halfway: 2 + 18 / 2
  EXPECT_NEAR(role<ReconstructedByLayer>(q).reconstruction_penalty(100).item<double>(), expected(2),
              1e-7);  // ends at 2
  // Its gradient is the derivative of the formula (finite differences on V).
  at::Tensor v = q->parameters()[0];
  role<ReconstructedByLayer>(q).reconstruction_penalty(60).backward();
  const at::Tensor grad = v.grad().clone();
  for (int i = 0; i < 4; ++i) {
    const double eps = 1e-3, v0 = v[i].item<double>();
    auto at_v = [&](double x) {
      c10::NoGradGuard g;
      v[i].fill_(x);
      const double p = role<ReconstructedByLayer>(q).reconstruction_penalty(60).item<double>();
      v[i].fill_(v0);
      return p;
    };
    EXPECT_NEAR(grad[i].item<double>(), (at_v(v0 + eps) - at_v(v0 - eps)) / (2 * eps), 1e-4) << i;
  }
}

// The penalty with its step in a tensor (what recorded GPU steps replay) follows the same
// schedule: 0 in the warm-up, the hand formula after it, the host penalty's gradient.
TEST(AdaRound, RegularizerWithTheStepInATensorFollowsTheSameSchedule) {
  Options o("[w.quantizer_options]");
  o.set("iterations", std::int64_t{100});
  o.set("lambda", 0.01);
  o.set("beta_end", 0.5);  // beta < 1: |2h - 1|^beta has an infinite slope at 0
  auto q = make_adaround(int4_weight(), o);
  q->initialize(per_tensor(0.5));
  role<ReconstructedByLayer>(q).begin_reconstruction(
      at::tensor({0.3f, -0.8f, 1.1f, 3.9f, 0.25f}));  // 0.25 / 0.5 is half way: |2h - 1| = 0
  auto expected = [](double beta) {
    return 0.01 * (2 * (1 - std::pow(0.2, beta)) + 2 * (1 - std::pow(0.6, beta)) + 1);
  };
  auto on_device = [&](std::int64_t step) {
    return role<PenaltyOnDevice>(q).reconstruction_penalty_on_device(at::scalar_tensor(step, at::kLong));
  };
  EXPECT_EQ(on_device(0).item<double>(), 0.0);
  EXPECT_EQ(on_device(19).item<double>(), 0.0);
  EXPECT_NEAR(on_device(20).item<double>(), expected(20), 1e-7);
  EXPECT_NEAR(on_device(60).item<double>(), expected(10.25), 1e-7);  // 0.5 + 19.5 / 2
  EXPECT_NEAR(on_device(100).item<double>(), expected(0.5), 1e-7);
  at::Tensor v = q->parameters()[0];
  for (std::int64_t step : {5, 60, 100}) {
    on_device(step).backward();
    const at::Tensor device_grad = v.grad().clone();
    v.mutable_grad() = at::Tensor();
    at::Tensor host = role<ReconstructedByLayer>(q).reconstruction_penalty(step);
    at::Tensor host_grad = at::zeros_like(v);
    if (host.requires_grad()) {
      host.backward();
      host_grad = v.grad().clone();
      v.mutable_grad() = at::Tensor();
    }
    // The element at |2h - 1| = 0 has no gradient on the device; the host's is NaN or 0 there.
    EXPECT_TRUE(at::isfinite(device_grad).all().item<bool>()) << step;
    EXPECT_EQ(device_grad[4].item<double>(), 0.0) << step;
    EXPECT_TRUE(at::allclose(device_grad.narrow(0, 0, 4), host_grad.narrow(0, 0, 4), 1e-5, 1e-8)) << step;
  }
}

TEST(AdaRound, HardRoundingFollowsTheLearntVariableNotTheNearestValue) {
  Options o("[w.quantizer_options]");
  auto q = make_adaround(int4_weight(), o);
  q->initialize(per_tensor(0.5));
  role<ReconstructedByLayer>(q).begin_reconstruction(kWeight);
  {
    c10::NoGradGuard g;
    q->parameters()[0][0].fill_(-3.0);  // 0.6 rounds down
    q->parameters()[0][1].fill_(2.0);   // -1.6 rounds up
  }
  role<ReconstructedByLayer>(q).end_reconstruction();
  EXPECT_TRUE(q->parameters().empty());
  EXPECT_TRUE(at::equal(q->forward(kWeight), at::tensor({0.0f, -0.5f, 1.0f, 3.5f})));
  EXPECT_THROW(q->forward(at::zeros({3})), Error);  // learnt for one weight shape
}

TEST(AdaRound, RefusesActivationsAndBadOptions) {
  QSpec act;
  EXPECT_NE(error_of([&] { make_adaround(act, Options("[a.quantizer_options]")); }).find("weights"), std::string::npos);
  Options bad("[w.quantizer_options]");
  bad.set("warm_up", 1.5);
  EXPECT_NE(error_of([&] { make_adaround(int4_weight(), bad); }).find("warm_up"), std::string::npos);
  Options endless("[w.quantizer_options]");  // a run that would never end
  endless.set("iterations", std::int64_t{9223372036854775807});
  EXPECT_NE(error_of([&] { make_adaround(int4_weight(), endless); }).find("iterations must be 1 to 10000000"),
            std::string::npos);
}

TEST(AdaRound, SingleLayerReconstructionBeatsRoundToNearestAndExportsItsIntegers) {
  const Builder b = single_conv(7);
  at::manual_seed(8);
  const at::Tensor mix = at::randn({8, 3});
  const std::vector<at::Tensor> calib = {correlated_inputs(8, mix), correlated_inputs(8, mix),
                                         correlated_inputs(8, mix)};
  const at::Tensor held_out = correlated_inputs(16, mix);
  auto rtn = calibrate(b.g, w4_config("uniform", "layerwise"), calib);
  auto ada = calibrate(b.g, w4_config("adaround", "layerwise", kFewIterations), calib);
  ASSERT_EQ(ada.stats.reconstructions.size(), 1u);
  const ReconstructionReport& r = ada.stats.reconstructions[0];
  EXPECT_EQ(r.node, "conv");
  EXPECT_EQ(r.iterations, 1000);
  // The reported round-to-nearest error is what the uniform quantizer gives on the same data.
  at::Tensor all = at::cat(calib);
  EXPECT_NEAR(r.mse_nearest, output_mse(rtn.qm, all), 1e-3 * r.mse_nearest);
  EXPECT_NEAR(r.mse_learnt, output_mse(ada.qm, all), 1e-3 * r.mse_learnt);
  const double rtn_mse = output_mse(rtn.qm, held_out), ada_mse = output_mse(ada.qm, held_out);
  std::printf("int4 conv, held-out output MSE: round to nearest %.4g, AdaRound %.4g\n", rtn_mse, ada_mse);
  EXPECT_LT(r.mse_learnt, 0.5 * r.mse_nearest);  // measured: 5x lower
  EXPECT_LT(ada_mse, 0.5 * rtn_mse);
  // Same scales; some weights rounded the other way.
  const QuantSlot* w_rtn = nullptr;
  const QuantSlot* w_ada = nullptr;
  for (std::size_t i = 0; i < rtn.qm.slots().size(); ++i)
    if (rtn.qm.slots()[i].role == InputRole::kWeight) w_rtn = &rtn.qm.slots()[i], w_ada = &ada.qm.slots()[i];
  ASSERT_TRUE(w_rtn && w_ada);
  EXPECT_TRUE(at::equal(w_rtn->quantizer->qparams().scale, w_ada->quantizer->qparams().scale));
  const at::Tensor& w = b.g.initializers.at("w");
  const at::Tensor ada_w = w_ada->quantizer->forward(w).detach();
  const double flipped = (ada_w != w_rtn->quantizer->forward(w).detach()).to(at::kFloat).mean().item<double>();
  EXPECT_GT(flipped, 0.01);
  // Export stores exactly the learnt integers: DequantizeLinear of them is the simulated weight.
  Graph g = ada.qm.export_graph();
  bool found = false;
  for (const Node* n : g.nodes()) {
    if (n->op_type != "DequantizeLinear" || !g.initializers.count(n->inputs[0])) continue;
    const at::Tensor q = g.initializers.at(n->inputs[0]);
    if (q.dim() != 4) continue;
    const at::Tensor scale = g.initializers.at(n->inputs[1]).reshape({-1, 1, 1, 1});
    EXPECT_TRUE(at::equal(q.to(at::kFloat) * scale, ada_w));
    found = true;
  }
  EXPECT_TRUE(found);
}

TEST(AdaRound, NeedsALayerwiseModeAndSaysSo) {
  const Builder b = single_conv(1);
  const std::string msg = error_of([&] {
    calibrate(b.g, w4_config("adaround", "streaming"), {at::randn({2, 8, 10, 10})});
  });
  EXPECT_NE(msg.find("mode = \"layerwise\" or \"asym\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("'conv'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparsebit::testing
