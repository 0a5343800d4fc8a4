// AWQ: the float function is unchanged before rounding (scales fold into RMSNorm's gamma and the
// up projection of a gated MLP, or go into an inserted Mul); the chosen scales are as good as a
// brute-force search on the samples themselves, with rounding written here; and through the
// whole pipeline (weight-only INT4 per group) the output error falls below plain rounding's.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "pass_testing.h"

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

/// Symmetric round to nearest on `bits` per group of `group` rows along K of a [K, N] weight,
/// written here from the definition: scale = max|w| / (2^(bits-1) - 1) per group and column.
at::Tensor rtn_kn(const at::Tensor& w, std::int64_t group, int bits) {
  const double qmax = std::pow(2.0, bits - 1) - 1;
  std::vector<at::Tensor> parts;
  for (std::int64_t b = 0; b < w.size(0); b += group) {
    const at::Tensor g = w.slice(0, b, std::min(w.size(0), b + group)).to(at::kDouble);
    const at::Tensor scale = (g.abs().amax(0, true) / qmax).clamp_min(1e-12);
    parts.push_back(((g / scale).round().clamp(-qmax - 1, qmax) * scale).to(w.scalar_type()));
  }
  return at::cat(parts, 0);
}

/// A PassData whose weight grid is rtn_kn for MatMul weights ([K, N], channel axis 1).
struct Samples {
  TempDir dir;
  std::vector<at::Tensor> batches;
  std::int64_t group;
  Samples(const std::vector<std::int64_t>& shape, int count, const at::Tensor& channel_gain, std::int64_t group_size)
      : group(group_size) {
    std::vector<std::int64_t> batch{4};
    batch.insert(batch.end(), shape.begin(), shape.end());
    for (int i = 0; i < count; ++i) {
      at::Tensor x = at::randn(batch) * channel_gain;
      batches.push_back(x);
      write_npy(x, dir / ("x" + std::to_string(i) + ".npy"));
    }
  }
  PassData data(const Graph& g) const {
    const auto inputs = g.inputs;
    const std::string path = dir.path().string();
    const std::int64_t size = group;
    PassData d{[path, inputs] { return open_dataset(path, inputs); }, 8, 0};
    d.weight_grid = [size](const Node& n, std::size_t input,
                           std::int64_t axis) -> std::optional<PassContext::WeightGrid> {
      if (n.op_type != "MatMul" || input != 1 || axis != 1) return std::nullopt;
      QSpec spec;
      spec.bits = 4;
      spec.group_size = size;
      return PassContext::WeightGrid{spec, [size](const at::Tensor& w) { return rtn_kn(w, size, 4); }};
    };
    return d;
  }
};

Graph awq(const Graph& g, const Samples& s, bool clip, std::int64_t grid = 20) {
  Graph after = g.clone();
  ScheduleEntry e{"awq", true, Options("[passes.awq]")};
  e.options.set("clip_search", clip);
  e.options.set("grid", grid);
  EXPECT_TRUE(run_passes({e}, Pass::Stage::kSimplify, after, shipped_registry(), nullptr, "test", s.data(g)));
  return after;
}

/// The squared output error over the samples of `g` with node "fc"'s weight rounded by rtn_kn
/// on the samples' groups, against the float `original`.
double rounded_error(const Graph& g, const Graph& original, const Samples& s) {
  Graph q = g.clone();
  std::string& name = q.find_node("fc")->inputs[1];
  q.initializers[name] = rtn_kn(q.initializers.at(name), s.group, 4);
  double e = 0;
  for (const auto& x : s.batches) e += (run(q, x) - run(original, x)).pow(2).sum().item<double>();
  return e;
}

double max_rel_diff(const Graph& a, const Graph& b, const std::vector<at::Tensor>& xs) {
  double worst = 0;
  for (const auto& x : xs) {
    const at::Tensor want = run(a, x), got = run(b, x);
    worst = std::max(worst, (got - want).abs().max().item<double>() / want.abs().max().item<double>());
  }
  return worst;
}

/// A Llama-shaped block: RMSNorm's Mul by gamma (outlier channels 3 and 9), query and key
/// projections, a SwiGLU MLP (SiLU as gate * Sigmoid(gate)) whose down projection reads the
/// gated product, a residual, and an output projection of the residual sum, which the final
/// Add reads too.
Builder llama_block() {
  at::manual_seed(11);
  Builder b({4, 6, 16});
  at::Tensor gamma = at::ones({16});
  gamma[3] = 40;
  gamma[9] = 15;
  b.constant("gamma", gamma);
  for (const char* w : {"wq", "wk"}) b.constant(w, at::randn({16, 16}) * 0.2);
  b.constant("wg", at::randn({16, 32}) * 0.2);
  b.constant("wu", at::randn({16, 32}) * 0.2);
  b.constant("wd", at::randn({32, 16}) * 0.2);
  b.constant("wo", at::randn({16, 16}) * 0.2);
  b.add("norm", "Mul", {"x", "gamma"}, {"h"});
  b.add("q", "MatMul", {"h", "wq"}, {"q_out"});
  b.add("k", "MatMul", {"h", "wk"}, {"k_out"});
  b.add("gate", "MatMul", {"h", "wg"}, {"g"});
  b.add("up", "MatMul", {"h", "wu"}, {"u"});
  b.add("sig", "Sigmoid", {"g"}, {"gs"});
  b.add("silu", "Mul", {"g", "gs"}, {"act"});
  b.add("gated", "Mul", {"act", "u"}, {"a"});
  b.add("down", "MatMul", {"a", "wd"}, {"d"});
  b.add("qk", "Add", {"q_out", "k_out"}, {"qk_out"});
  b.add("res", "Add", {"qk_out", "d"}, {"r"});
  b.add("o", "MatMul", {"r", "wo"}, {"o_out"});
  b.add("out", "Add", {"o_out", "r"}, {"y"});
  return b;
}

TEST(Awq, KeepsTheFloatFunctionAndFoldsWhereTheGraphAllows) {
  Builder b = llama_block();
  at::Tensor gain = at::ones({16});
  gain[5] = 8;
  Samples s({6, 16}, 3, gain, 8);
  Graph g = awq(b.g, s, false);
  EXPECT_LE(max_rel_diff(b.g, g, s.batches), 1e-5);
  // RMSNorm's gamma took 1/s for q, k, gate and up (no Mul in front of them); the down
  // projection's scale went into the up projection's output columns; the residual sum r is
  // read by the final Add as well, so its scale is an inserted Mul in front of `o`.
  EXPECT_NE(g.find_node("norm")->inputs[1], "gamma");
  for (const char* n : {"q", "k", "gate", "up"}) EXPECT_EQ(g.find_node(n)->inputs[0], "h") << n;
  EXPECT_NE(g.find_node("up")->inputs[1], "wu");
  EXPECT_NE(g.find_node("gate")->inputs[1], "wg");  // its rows took s
  EXPECT_EQ(g.find_node("down")->inputs[0], "a");
  const Node* mul = g.producer(g.find_node("o")->inputs[0]);
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->op_type, "Mul");
  EXPECT_EQ(ops(g).size(), ops(b.g).size() + 1);
  // The inputs of the folded layers changed as the scales say: h's outlier channels shrank.
  const at::Tensor before = b.g.initializers.at("gamma"), after = g.initializers.at(g.find_node("norm")->inputs[1]);
  EXPECT_LT((after.abs().max() / after.abs().min()).item<double>(),
            (before.abs().max() / before.abs().min()).item<double>());
}

// One layer reading the graph input (channel 2 forty times the rest): the error of the chosen s,
// measured on the samples with the rounding above, equals the least error over the same alphas.
TEST(Awq, ChoosesScalesAsGoodAsABruteForceSearchOnTheSamples) {
  at::manual_seed(12);
  Builder b({4, 24});
  const at::Tensor w = at::randn({24, 8});
  b.constant("w", w);
  b.add("fc", "MatMul", {"x", "w"}, {"y"});
  at::Tensor gain = at::ones({24});
  gain[2] = 40;
  gain[17] = 6;
  Samples s({24}, 4, gain, 8);
  Graph g = awq(b.g, s, false);
  ASSERT_EQ(ops(g), (std::vector<std::string>{"Mul", "MatMul"}));
  const at::Tensor inv = g.initializers.at(g.nodes()[0]->inputs[1]).to(at::kDouble);
  const at::Tensor x = at::cat(s.batches, 0).to(at::kDouble);
  auto error_of = [&](const at::Tensor& sc) {  // s as [24] doubles
    const at::Tensor wq = rtn_kn((w.to(at::kDouble) * sc.unsqueeze(1)), 8, 4) / sc.unsqueeze(1);
    return (at::mm(x, wq) - at::mm(x, w.to(at::kDouble))).pow(2).sum().item<double>();
  };
  const at::Tensor mean = x.abs().mean(0);
  double best = std::numeric_limits<double>::infinity(), plain = error_of(at::ones({24}, at::kDouble));
  for (int i = 0; i < 20; ++i) {
    at::Tensor sc = mean.pow(i / 20.0);
    sc = sc / (sc.max() * sc.min()).sqrt();
    best = std::min(best, error_of(sc));
  }
  const double chosen = error_of(1.0 / inv);
  std::printf("output error: plain %.4g, brute-force best %.4g, chosen %.4g\n", plain, best, chosen);
  EXPECT_LE(chosen, best * (1 + 1e-3));
  EXPECT_LT(chosen, 0.8 * plain);
  // The weight rows took exactly s.
  const at::Tensor scaled = g.initializers.at(g.find_node("fc")->inputs[1]).to(at::kDouble);
  EXPECT_TRUE(at::allclose(scaled * inv.unsqueeze(1), w.to(at::kDouble), 1e-5, 1e-6));
}

// Clip search lowers every group's error on the Gram of its inputs, so the layer's error too.
TEST(Awq, ClipSearchLowersTheOutputErrorFurther) {
  at::manual_seed(13);
  Builder b({4, 32});
  at::Tensor w = at::randn({32, 8});
  w[4][1] = 9;  // outlier weights stretch their groups' grids
  w[20][5] = -7;
  b.constant("w", w);
  b.add("fc", "MatMul", {"x", "w"}, {"y"});
  Samples s({32}, 4, at::ones({32}), 16);
  auto error_of = [&](const Graph& g) { return rounded_error(g, b.g, s); };
  Graph plain = b.g.clone();
  const double e_plain = error_of(plain);
  Graph clipped = awq(b.g, s, true);
  // No activation outliers: the scales may stay 1; the weights were clipped.
  EXPECT_NE(clipped.find_node("fc")->inputs[1], "w");
  for (const auto& [name, t] : clipped.initializers)  // replaced weights are not kept beside the new ones
    EXPECT_FALSE(clipped.consumers(name).empty()) << name << " is no longer read";
  const double e_clip = error_of(clipped);
  std::printf("output error: plain %.4g, clipped %.4g\n", e_plain, e_clip);
  EXPECT_LT(e_clip, 0.9 * e_plain);
}

// Scales judged after their own clipping: never worse than clipping the plain weights (grid = 1
// tries alpha = 0 only), measured on the samples with the weights rounded as above.
TEST(Awq, ScalesWithClippingAreNeverWorseThanClippingAlone) {
  at::manual_seed(14);
  Builder b({4, 32});
  at::Tensor w = at::randn({32, 8});
  w[4][1] = 9;
  w[20][5] = -7;
  b.constant("w", w);
  b.add("fc", "MatMul", {"x", "w"}, {"y"});
  at::Tensor gain = at::ones({32});
  gain[3] = 30;
  gain[20] = 8;
  Samples s({32}, 4, gain, 16);
  auto error_of = [&](const Graph& g) { return rounded_error(g, b.g, s); };
  const double e_clip = error_of(awq(b.g, s, true, 1)), e_both = error_of(awq(b.g, s, true));
  const double e_scale = error_of(awq(b.g, s, false));
  std::printf("output error: clipped %.4g, scaled %.4g, scaled and clipped %.4g\n", e_clip, e_scale, e_both);
  EXPECT_LE(e_both, e_clip * (1 + 1e-4));
  EXPECT_LE(e_both, e_scale * (1 + 1e-4));
}

// Through the pipeline: weight-only uint4 with zero points per group of 8 (the scheme AWQ is made
// for), rtn, with and without [schedule] awq.
TEST(Awq, WeightOnlyInt4LosesLessThanRoundToNearest) {
  Builder b = llama_block();
  Samples s({6, 16}, 4, at::ones({16}), 16);
  auto mse = [&](const std::string& schedule) {
    Config c = Config::from_string(
        "backend = \"virtual\"\n[w]\nqscheme = \"per-group-affine\"\nbits = 4\ngroup_size = 8\n"
        "quantizer = \"rtn\"\n" +
            schedule,
        "awq.toml");
    PassData data = s.data(b.g);
    QuantModel qm(Model{b.g.clone(), ModelMeta{}}, c, shipped_registry(), s.dir.path().string());
    auto calib = data.open();
    qm.calibrate(*calib);
    double err = 0;
    for (const auto& x : s.batches) {
      qm.set_quant(true, true);
      err += (qm.forward({x})[0] - run(b.g, x)).pow(2).mean().item<double>();
    }
    return err;
  };
  const double rtn = mse(""), scaled = mse("[schedule]\nawq = true\n[passes.awq]\nclip_search = false\n"),
               clipped = mse("[schedule]\nawq = true\n");
  std::printf("W4 g8 output MSE: rtn %.4g, awq %.4g, awq + clip %.4g\n", rtn, scaled, clipped);
  EXPECT_LT(scaled, 0.7 * rtn);
  EXPECT_LT(clipped, scaled);
}

TEST(Awq, SaysWhatItNeeds) {
  Builder b = llama_block();
  Graph g = b.g.clone();
  try {
    run_simplify_pass("awq", g, shipped_registry());
    FAIL() << "awq ran without a quantization config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass 'awq'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs the weight grids of a quantization config"), std::string::npos)
        << e.what();
  }
  Samples s({6, 16}, 1, at::ones({16}), 8);
  PassData no_samples = s.data(b.g);
  no_samples.open = {};
  ScheduleEntry e{"awq", true, Options("[passes.awq]")};
  EXPECT_THROW(
      {
        try {
          run_passes({e}, Pass::Stage::kSimplify, g, shipped_registry(), nullptr, "t.toml", no_samples);
        } catch (const Error& err) {
          EXPECT_NE(std::string(err.what()).find("needs calibration data"), std::string::npos) << err.what();
          throw;
        }
      },
      Error);
  ScheduleEntry bad{"awq", true, Options("[passes.awq]")};
  bad.options.set("max_shrink", 1.5);
  EXPECT_THROW(run_passes({bad}, Pass::Stage::kSimplify, g, shipped_registry(), nullptr, "t.toml", s.data(b.g)), Error);
}

}  // namespace
}  // namespace sparsebit::testing
