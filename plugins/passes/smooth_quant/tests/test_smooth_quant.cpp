// SmoothQuant: the float function is unchanged (to 1e-5), the scales follow the published
// formula, they fold into LayerNormalization / a producing Conv or go into an inserted Mul, and
// per-tensor 8-bit activations lose much less on activations with outlier channels.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

/// Calibration samples in a folder of .npy files (batches of 4, channel `channel_axis` of each
/// sample scaled by `channel_gain`), served as PassData.
struct Samples {
  TempDir dir;
  std::vector<at::Tensor> batches;
  Samples(const std::vector<std::int64_t>& shape, int count, const at::Tensor& channel_gain, int channel_axis) {
    std::vector<std::int64_t> gain_shape(shape.size() + 1, 1), batch{4};
    gain_shape[static_cast<std::size_t>(channel_axis)] = channel_gain.numel();
    batch.insert(batch.end(), shape.begin(), shape.end());
    for (int i = 0; i < count; ++i) {
      at::Tensor x = at::randn(batch) * channel_gain.reshape(gain_shape);
      batches.push_back(x);
      write_npy(x, dir / ("x" + std::to_string(i) + ".npy"));
    }
  }
  PassData data(const Graph& g) const {
    const auto inputs = g.inputs;
    const std::string path = dir.path().string();
    return PassData{[path, inputs] { return open_dataset(path, inputs); }, 8, 0};
  }
};

Graph smoothed(const Graph& g, const Samples& s, double alpha = 0.5, bool depthwise = false) {
  Graph after = g.clone();
  ScheduleEntry e{"smooth_quant", true, Options("[passes.smooth_quant]")};
  e.options.set("alpha", alpha);
  if (depthwise) e.options.set("depthwise", true);
  EXPECT_TRUE(run_passes({e}, Pass::Stage::kSimplify, after, shipped_registry(), nullptr, "test", s.data(g)));
  for (const auto& x : s.batches) {
    const at::Tensor want = run(g, x), got = run(after, x);
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * std::max(1.0, want.abs().max().item<double>()));
  }
  return after;
}

/// LayerNormalization whose scale makes channels 3 and 7 outliers, read by two MatMuls (the
/// query and key projections of attention), added.
Builder layernorm_projections() {
  at::manual_seed(5);
  Builder b({4, 6, 16});
  at::Tensor gamma = at::ones({16});
  gamma[3] = 100;
  gamma[7] = 60;
  b.constant("gamma", gamma);
  b.constant("beta", at::randn({16}) * 0.1);
  b.constant("wq", at::randn({16, 8}) * 0.3);
  b.constant("wk", at::randn({16, 8}) * 0.3);
  b.add("ln", "LayerNormalization", {"x", "gamma", "beta"}, {"h"}, {{"axis", Attribute::of_int(-1)}});
  b.add("q", "MatMul", {"h", "wq"}, {"q_out"});
  b.add("k", "MatMul", {"h", "wk"}, {"k_out"});
  b.add("sum", "Add", {"q_out", "k_out"}, {"y"});
  return b;
}

TEST(SmoothQuant, FoldsIntoLayerNormWithThePublishedScales) {
  Builder b = layernorm_projections();
  Samples s({6, 16}, 3, at::ones({16}), 2);
  Graph g = smoothed(b.g, s);
  EXPECT_EQ(ops(g), ops(b.g));  // folded: no Mul
  // s_j = max|h_j|^0.5 / max(max|wq_j|, max|wk_j|)^0.5, from the float h on the samples.
  Builder probe = layernorm_projections();
  probe.g.outputs[0].name = "h";
  at::Tensor ah;
  for (const auto& x : s.batches) {
    at::Tensor m = run(probe.g, x).abs().reshape({-1, 16}).amax(0);
    ah = ah.defined() ? at::maximum(ah, m) : m;
  }
  const at::Tensor aw = at::maximum(b.g.initializers.at("wq").abs().amax(1), b.g.initializers.at("wk").abs().amax(1));
  const at::Tensor want = ah.sqrt() / aw.sqrt();
  const Node* ln = g.find_node("ln");
  const at::Tensor got = b.g.initializers.at("gamma") / g.initializers.at(ln->inputs[1]);
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-6)) << got << want;
  // The outlier channels are flattened: the spread of channel ranges shrinks.
  probe.g = g.clone();
  probe.g.outputs[0].name = "h";
  at::Tensor after;
  for (const auto& x : s.batches) {
    at::Tensor m = run(probe.g, x).abs().reshape({-1, 16}).amax(0);
    after = after.defined() ? at::maximum(after, m) : m;
  }
  EXPECT_LT((after.max() / after.min()).item<double>(), 0.5 * (ah.max() / ah.min()).item<double>());
}

// LayerNorm's affine tail as opset-11 exporters write it: Mul by gamma, Add beta.
TEST(SmoothQuant, FoldsIntoTheMulAddTailOfADecomposedLayerNorm) {
  at::manual_seed(8);
  Builder b({4, 5, 16});
  at::Tensor gamma = at::ones({16});
  gamma[2] = 80;
  b.constant("gamma", gamma);
  b.constant("beta", at::randn({16}));
  b.constant("w", at::randn({16, 6}));
  b.add("scale", "Mul", {"x", "gamma"}, {"scaled"});
  b.add("shift", "Add", {"scaled", "beta"}, {"h"});
  b.add("proj", "MatMul", {"h", "w"}, {"y"});
  Samples s({5, 16}, 2, at::ones({16}), 2);
  Graph g = smoothed(b.g, s);
  EXPECT_EQ(ops(g), ops(b.g));
  EXPECT_NE(g.find_node("scale")->inputs[1], "gamma");
  EXPECT_NE(g.find_node("shift")->inputs[1], "beta");
}

TEST(SmoothQuant, InsertsAMulWhereNothingCanAbsorbTheScale) {
  at::manual_seed(6);
  Builder b({4, 12});  // x feeds a Gemm (transB) straight from the graph input
  b.constant("w", at::randn({5, 12}));
  b.constant("c", at::randn({5}));
  b.add("fc", "Gemm", {"x", "w", "c"}, {"y"}, {{"transB", Attribute::of_int(1)}});
  at::Tensor gain = at::ones({12});
  gain[0] = 50;
  Samples s({12}, 2, gain, 1);
  Graph g = smoothed(b.g, s, 0.8);
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Mul", "Gemm"}));
}

TEST(SmoothQuant, FoldsIntoTheConvBeforeAPointwiseConv) {
  at::manual_seed(7);
  Builder b({4, 3, 6, 6});
  at::Tensor w1 = at::randn({8, 3, 3, 3});
  w1.narrow(0, 2, 1).mul_(30);  // output channel 2 of conv1 is an outlier
  b.constant("w1", w1);
  b.constant("b1", at::randn({8}));
  b.constant("w2", at::randn({4, 8, 1, 1}));
  b.add("conv1", "Conv", {"x", "w1", "b1"}, {"c1"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  b.add("pw", "Conv", {"c1", "w2"}, {"y"});
  Samples s({3, 6, 6}, 2, at::ones({3}), 1);
  Graph g = smoothed(b.g, s);
  EXPECT_EQ(ops(g), ops(b.g));
  EXPECT_NE(g.find_node("conv1")->inputs[2], "b1");  // the bias took 1/s too
}

// The point of it: W8A8 with per-tensor activations on outlier channels.
TEST(SmoothQuant, PerTensorActivationsLoseLessAfterSmoothing) {
  Builder b = layernorm_projections();
  Samples s({6, 16}, 4, at::ones({16}), 2);
  auto sqnr = [&](bool smooth) {
    Config c = Config::from_string(std::string("backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\n[a]\n"
                                               "qscheme = \"per-tensor-symmetric\"\n[schedule]\nsmooth_quant = ") +
                                       (smooth ? "true" : "false") + "\n",
                                   "sq.toml");
    PassData data = s.data(b.g);
    QuantModel qm(Model{b.g.clone(), ModelMeta{}}, c, shipped_registry(), s.dir.path().string());
    auto calib = data.open();
    qm.calibrate(*calib);
    double signal = 0, noise = 0;
    for (const auto& x : s.batches) {
      qm.set_quant(false, false);
      const at::Tensor f = qm.forward({x})[0];
      qm.set_quant(true, true);
      const at::Tensor q = qm.forward({x})[0];
      signal += f.pow(2).sum().item<double>();
      noise += (q - f).pow(2).sum().item<double>();
    }
    return 10 * std::log10(signal / noise);
  };
  const double plain = sqnr(false), smooth = sqnr(true);
  std::printf("per-tensor W8A8 output SQNR: %.2f dB plain, %.2f dB smoothed\n", plain, smooth);
  EXPECT_GT(smooth, plain + 3) << "dB: plain " << plain << ", smoothed " << smooth;
}

// A depthwise convolution reading channels whose ranges differ 200-fold (as after a BatchNorm
// fold and hard-swish), with option depthwise = true: filter j takes s_j = (max|x_j| / max|w_j|)^0.5 and the inserted
// Mul 1 / s_j, the float function stays, and the quiet channel loses far less.
TEST(SmoothQuant, DepthwiseFiltersAbsorbTheChannelScales) {
  at::manual_seed(10);
  Builder b({4, 4, 6, 6});
  b.constant("w", at::randn({4, 1, 3, 3}));
  b.add("dw", "Conv", {"x", "w"}, {"y"}, {{"group", Attribute::of_int(4)}, {"pads", Attribute::of_ints({1, 1, 1, 1})}});
  Samples s({4, 6, 6}, 3, at::tensor({0.1f, 1.0f, 5.0f, 20.0f}), 1);
  Graph untouched = b.g.clone();  // depthwise = false, the default: nothing to smooth
  ScheduleEntry defaults{"smooth_quant", true, Options("[passes.smooth_quant]")};
  EXPECT_FALSE(
      run_passes({defaults}, Pass::Stage::kSimplify, untouched, shipped_registry(), nullptr, "test", s.data(b.g)));
  Graph g = smoothed(b.g, s, 0.5, true);
  ASSERT_EQ(ops(g), (std::vector<std::string>{"Mul", "Conv"}));
  at::Tensor ax;
  for (const auto& x : s.batches) {
    at::Tensor m = x.abs().amax({0, 2, 3});
    ax = ax.defined() ? at::maximum(ax, m) : m;
  }
  const at::Tensor aw = b.g.initializers.at("w").abs().amax({1, 2, 3});
  const at::Tensor want = (ax / aw).sqrt();
  const at::Tensor factor = g.initializers.at(g.nodes()[0]->inputs[1]).reshape({4});
  EXPECT_TRUE(at::allclose(factor, 1.0 / want, 1e-4, 1e-7)) << factor << 1.0 / want;
  const at::Tensor w = g.initializers.at(g.find_node("dw")->inputs[1]);
  EXPECT_TRUE(at::allclose(w, b.g.initializers.at("w") * want.reshape({4, 1, 1, 1}), 1e-4, 1e-6));

  // Output SQNR of the quietest channel (channel 0), where per-tensor rounding hurts.
  auto quiet_sqnr = [&](const Graph& graph) {
    Config c = Config::from_string(
        "backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\n[a]\nqscheme = \"per-tensor-symmetric\"\n",
        "dw.toml");
    QuantModel qm(Model{graph.clone(), ModelMeta{}}, c, shipped_registry());
    auto calib = s.data(graph).open();
    qm.calibrate(*calib);
    double signal = 0, noise = 0;
    for (const auto& x : s.batches) {
      qm.set_quant(false, false);
      const at::Tensor f = qm.forward({x})[0].select(1, 0);
      qm.set_quant(true, true);
      const at::Tensor q = qm.forward({x})[0].select(1, 0);
      signal += f.pow(2).sum().item<double>();
      noise += (q - f).pow(2).sum().item<double>();
    }
    return 10 * std::log10(signal / noise);
  };
  const double plain = quiet_sqnr(b.g), smooth = quiet_sqnr(g);
  std::printf("depthwise, per-tensor W8A8, quietest channel's SQNR: %.2f dB plain, %.2f dB smoothed\n", plain, smooth);
  EXPECT_GT(smooth, plain + 20) << "dB";
}

TEST(SmoothQuant, WithoutCalibrationDataSaysWhatItNeeds) {
  Builder b = layernorm_projections();
  Graph g = b.g.clone();
  const std::string e = error_of([&] { run_simplify_pass("smooth_quant", g, shipped_registry()); });
  EXPECT_NE(e.find("needs calibration data"), std::string::npos) << e;
}

}  // namespace
}  // namespace sparsebit::testing
