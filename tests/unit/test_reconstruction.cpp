// AdaRound (soft rounding and regularizer against hand values, hard rounding, export), layer
// reconstruction against round-to-nearest on a single layer, the asym runner's memory, and
// bias correction (the mean output error it removes, measured independently).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ops/upsample_bilinear2d.h>

#include <cmath>

#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using testing::Builder;

std::unique_ptr<Quantizer> make_adaround(const QSpec& spec, const Options& options) {
  const auto* e = testing::shipped_registry().quantizer("adaround");
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
  q->begin_reconstruction(kWeight);
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
  q->begin_reconstruction(kWeight);
  // lambda * sum(1 - |2h - 1|^beta) with h = [0.6, 0.4, 0.2, 0.8]: |2h - 1| = [0.2, 0.2, 0.6, 0.6].
  auto expected = [](double beta) {
    return 0.01 * (2 * (1 - std::pow(0.2, beta)) + 2 * (1 - std::pow(0.6, beta)));
  };
  EXPECT_EQ(q->reconstruction_penalty(0).item<double>(), 0.0);   // warm-up: first 20 steps
  EXPECT_EQ(q->reconstruction_penalty(19).item<double>(), 0.0);
  EXPECT_NEAR(q->reconstruction_penalty(20).item<double>(), expected(20), 1e-7);  // beta starts at 20
  EXPECT_NEAR(q->reconstruction_penalty(60).item<double>(), expected(11), 1e-7);  // halfway: 2 + 18 / 2
  EXPECT_NEAR(q->reconstruction_penalty(100).item<double>(), expected(2), 1e-7);  // ends at 2
  // Its gradient is the derivative of the formula (finite differences on V).
  at::Tensor v = q->parameters()[0];
  q->reconstruction_penalty(60).backward();
  const at::Tensor grad = v.grad().clone();
  for (int i = 0; i < 4; ++i) {
    const double eps = 1e-3, v0 = v[i].item<double>();
    auto at_v = [&](double x) {
      c10::NoGradGuard g;
      v[i].fill_(x);
      const double p = q->reconstruction_penalty(60).item<double>();
      v[i].fill_(v0);
      return p;
    };
    EXPECT_NEAR(grad[i].item<double>(), (at_v(v0 + eps) - at_v(v0 - eps)) / (2 * eps), 1e-4) << i;
  }
}

TEST(AdaRound, HardRoundingFollowsTheLearntVariableNotTheNearestValue) {
  Options o("[w.quantizer_options]");
  auto q = make_adaround(int4_weight(), o);
  q->initialize(per_tensor(0.5));
  q->begin_reconstruction(kWeight);
  {
    c10::NoGradGuard g;
    q->parameters()[0][0].fill_(-3.0);  // 0.6 rounds down
    q->parameters()[0][1].fill_(2.0);   // -1.6 rounds up
  }
  q->end_reconstruction();
  EXPECT_TRUE(q->parameters().empty());
  EXPECT_TRUE(at::equal(q->forward(kWeight), at::tensor({0.0f, -0.5f, 1.0f, 3.5f})));
  EXPECT_THROW(q->forward(at::zeros({3})), Error);  // learnt for one weight shape
}

TEST(AdaRound, RefusesActivationsAndBadOptions) {
  QSpec act;
  EXPECT_NE(testing::error_of([&] { make_adaround(act, Options("[a.quantizer_options]")); }).find("weights"),
            std::string::npos);
  Options bad("[w.quantizer_options]");
  bad.set("warm_up", 1.5);
  EXPECT_NE(testing::error_of([&] { make_adaround(int4_weight(), bad); }).find("warm_up"), std::string::npos);
}

/// x -> Conv(8 -> 16, 3x3) -> y, random weights with a bias; calibration data in `dir`.
Builder single_conv(std::int64_t seed) {
  at::manual_seed(seed);
  Builder b({8, 8, 10, 10});
  b.constant("w", at::randn({16, 8, 3, 3}) * 0.2);
  b.constant("bias", at::randn({16}) * 0.1);
  b.add("conv", "Conv", {"x", "w", "bias"}, {"y"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  return b;
}

Config w4_config(const std::string& quantizer, const std::string& mode, const std::string& extra = "") {
  return Config::from_string("backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\nbits = 4\nquantizer = \"" +
                                 quantizer + "\"\n" + extra + "[a]\nqscheme = \"per-tensor-affine\"\nbits = 8\n" +
                                 "[calibration]\nbatch_size = 16\nmode = \"" + mode + "\"\n",
                             "w4.toml");
}

const char* kFewIterations = "[w.quantizer_options]\niterations = 1000\nbatch_size = 8\nlearning_rate = 1e-2\n";

struct Calibrated {
  QuantModel qm;
  CalibrationStats stats;
};

Calibrated calibrate(const Graph& g, const Config& c, const std::vector<at::Tensor>& batches) {
  QuantModel qm(Model{g.clone(), ModelMeta{}}, c, testing::shipped_registry());
  testing::TempDir dir;
  for (std::size_t i = 0; i < batches.size(); ++i) write_npy(batches[i], dir / ("x" + std::to_string(i) + ".npy"));
  auto data = open_dataset(dir.path().string(), qm.graph().inputs);
  CalibrationStats stats = qm.calibrate(*data);
  return {std::move(qm), stats};
}

double output_mse(QuantModel& qm, const at::Tensor& x) {
  c10::NoGradGuard g;
  qm.set_quant(false, false);
  const at::Tensor ref = qm.forward({x})[0];
  qm.set_quant(true, true);
  const double mse = (qm.forward({x})[0] - ref).pow(2).mean().item<double>();
  qm.set_quant(false, false);
  return mse;
}

/// Inputs like a real layer's: 8 channels mixed from 3 latent ones, spatially smooth. (With
/// independent inputs the output error's Hessian is diagonal and rounding to nearest is already
/// optimal; AdaRound gains from the correlations real data has.)
at::Tensor correlated_inputs(std::int64_t n, const at::Tensor& mix) {
  const at::Tensor z = at::upsample_bilinear2d(at::randn({n, 3, 5, 5}), {10, 10}, false);
  return at::einsum("ck,nkhw->nchw", {mix, z}) + 0.05 * at::randn({n, 8, 10, 10});
}

TEST(AdaRound, SingleLayerReconstructionBeatsRoundToNearestAndExportsItsIntegers) {
  const Builder b = single_conv(7);
  at::manual_seed(8);
  const at::Tensor mix = at::randn({8, 3});
  const std::vector<at::Tensor> calib = {correlated_inputs(8, mix), correlated_inputs(8, mix), correlated_inputs(8, mix)};
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
  const std::string msg = testing::error_of([&] { calibrate(b.g, w4_config("adaround", "streaming"), {at::randn({2, 8, 10, 10})}); });
  EXPECT_NE(msg.find("mode = \"layerwise\" or \"asym\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("'conv'"), std::string::npos) << msg;
}

/// A chain of `layers` Conv+Relu blocks (8 channels, 6x6).
Builder conv_chain(int layers) {
  at::manual_seed(11);
  Builder b({4, 8, 6, 6});
  std::string x = "x";
  for (int i = 0; i < layers; ++i) {
    const std::string w = "w" + std::to_string(i), c = "c" + std::to_string(i);
    const std::string r = i + 1 == layers ? "y" : "r" + std::to_string(i);
    b.constant(w, at::randn({8, 8, 3, 3}) * 0.25);
    b.add("conv" + std::to_string(i), "Conv", {x, w}, {c}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
    b.add("relu" + std::to_string(i), "Relu", {c}, {r});
    x = r;
  }
  return b;
}

TEST(Layerwise, AsymRunnerReleasesBothStreamsAsItGoes) {
  at::manual_seed(12);
  std::vector<at::Tensor> calib;
  for (int i = 0; i < 5; ++i) calib.push_back(at::randn({4, 8, 6, 6}));
  const std::int64_t batch_bytes = 4 * 8 * 6 * 6 * 4;
  for (int layers : {3, 12}) {
    const Builder b = conv_chain(layers);
    const char* few = "[w.quantizer_options]\niterations = 2\n";
    auto asym = calibrate(b.g, w4_config("adaround", "asym", few), calib);
    auto lw = calibrate(b.g, w4_config("adaround", "layerwise", few), calib);
    EXPECT_EQ(asym.stats.reconstructions.size(), static_cast<std::size_t>(layers));
    // Per batch at most one input and one output of the current node in each stream, however
    // deep the chain (without release: 2 x layers values per batch and stream).
    EXPECT_LE(asym.stats.peak_cached_tensors, 4u * calib.size()) << layers << " layers";
    EXPECT_LE(asym.stats.peak_cached_bytes, 4 * batch_bytes * std::int64_t(calib.size())) << layers << " layers";
    EXPECT_LE(lw.stats.peak_cached_tensors, 2u * calib.size()) << layers << " layers";
    EXPECT_LE(lw.stats.peak_cached_bytes, 2 * batch_bytes * std::int64_t(calib.size())) << layers << " layers";
    // The quantized stream is real: deeper activation observers saw different data in asym mode.
    const auto& s_asym = asym.qm.slots();
    const auto& s_lw = lw.qm.slots();
    bool differs = false;
    for (std::size_t i = 0; i < s_asym.size(); ++i)
      if (s_asym[i].role == InputRole::kActivation && s_asym[i].calibrated && s_asym[i].node_name != "conv0")
        differs = differs || !at::equal(s_asym[i].quantizer->qparams().scale, s_lw[i].quantizer->qparams().scale);
    EXPECT_TRUE(differs);
  }
}

/// Mean of (float - quantized) output per channel (axis 1) over `x`.
at::Tensor mean_error_per_channel(QuantModel& qm, const at::Tensor& x) {
  c10::NoGradGuard g;
  qm.set_quant(false, false);
  const at::Tensor ref = qm.forward({x})[0];
  qm.set_quant(true, true);
  const at::Tensor q = qm.forward({x})[0];
  qm.set_quant(false, false);
  return (ref - q).transpose(0, 1).reshape({ref.size(1), -1}).mean(1);
}

TEST(BiasCorrection, RemovesTheMeanOutputErrorOfEachChannel) {
  const Builder b = single_conv(21);
  at::manual_seed(22);
  // Inputs with a non-zero mean, so weight rounding errors bias the output.
  const std::vector<at::Tensor> calib = {at::randn({8, 8, 10, 10}) + 1, at::randn({8, 8, 10, 10}) + 1};
  const char* per_tensor = "[w]\nqscheme = \"per-tensor-symmetric\"\nbits = 4\n[a]\ndisable = true\n";
  auto config = [&](bool correct) {
    return Config::from_string(std::string("backend = \"virtual\"\n") + per_tensor +
                                   "[calibration]\nmode = \"layerwise\"\n[schedule]\nbias_correction = " +
                                   (correct ? "true" : "false") + "\n",
                               "bc.toml");
  };
  auto plain = calibrate(b.g, config(false), calib);
  auto corrected = calibrate(b.g, config(true), calib);
  ASSERT_EQ(corrected.stats.layer_pass_changes.size(), 1u);
  EXPECT_EQ(corrected.stats.layer_pass_changes[0], "bias_correction: conv");
  const at::Tensor all = at::cat(calib);
  const at::Tensor before = mean_error_per_channel(plain.qm, all);
  // The float model is unchanged by correction except for the bias, so compare against the
  // original float outputs: quantized(corrected) - float(original).
  c10::NoGradGuard g;
  plain.qm.set_quant(false, false);
  const at::Tensor ref = plain.qm.forward({all})[0];
  corrected.qm.set_quant(true, true);
  const at::Tensor q = corrected.qm.forward({all})[0];
  const at::Tensor after = (ref - q).transpose(0, 1).reshape({16, -1}).mean(1);
  std::printf("largest per-channel mean output error: %.4g before bias correction, %.4g after\n",
              before.abs().max().item<double>(), after.abs().max().item<double>());
  EXPECT_GT(before.abs().max().item<double>(), 1e-2);
  EXPECT_LT(after.abs().max().item<double>(), 1e-5);
  // The bias moved by exactly the measured error, in the model that export writes.
  const at::Tensor shift = corrected.qm.graph().initializers.at("bias") - b.g.initializers.at("bias");
  EXPECT_TRUE(at::allclose(shift, before.to(at::kFloat), 1e-4, 1e-6));
}

TEST(BiasCorrection, NeedsALayerwiseMode) {
  const Builder b = single_conv(1);
  const std::string msg = testing::error_of([&] {
    calibrate(b.g, Config::from_string("[schedule]\nbias_correction = true\n", "bc.toml"), {at::randn({2, 8, 10, 10})});
  });
  EXPECT_NE(msg.find("bias_correction"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layerwise"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparsebit
