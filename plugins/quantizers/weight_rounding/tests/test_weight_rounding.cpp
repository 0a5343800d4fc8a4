// GPTQ and RTN's clip search on one layer against a reference written here from the paper's
// equations in double precision: the Optimal Brain Surgeon update with an explicit inverse
// Hessian, one column at a time (no Cholesky factor, no lazy batches).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "sparsebit/sdk/testing.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::testing {
namespace {

// The plugin these tests are for, as built (Note [Plugin test kit]).
const PluginUnderTest& plugin() {
  static const PluginUnderTest built(SPARSEBIT_PLUGIN_FILE);
  return built;
}

constexpr std::int64_t kIn = 64, kOut = 24, kGroup = 16;

/// 4-bit symmetric per-group weights of a MatMul weight [K, N]: groups along axis 0.
QSpec int4_groups() {
  QSpec s;
  s.bits = 4;
  s.is_weight = true;
  s.per_channel = true;
  s.channel_axis = 1;
  s.group_size = kGroup;
  s.group_axis = 0;
  return s;
}

/// Correlated layer inputs (as real activations are) and a weight [K, N].
std::pair<at::Tensor, at::Tensor> layer_data() {
  at::manual_seed(7);
  const at::Tensor mix = at::randn({kIn, kIn}) * 0.3 + at::eye(kIn);
  const at::Tensor feature_scale =
      at::rand({kIn}) * 2 + 0.1;  // its own statement: compilers order draws within one expression differently
  const at::Tensor x = at::randn({512, kIn}).mm(mix) * feature_scale;
  return {x, at::randn({kIn, kOut}) * 0.2};
}

QParams observed(const at::Tensor& w, const QSpec& spec) {
  auto [lo, hi] = range_per_param(w, spec);
  return qparams_from_range(lo, hi, spec, "test");
}

std::unique_ptr<Quantizer> solved(const std::string& name, const Options& options, const at::Tensor& w,
                                  const at::Tensor& x, const QSpec& spec) {
  auto q = plugin().quantizer(name, spec, options);
  q->initialize(observed(w, spec));
  EXPECT_NE(dynamic_cast<SolvedFromInputs*>(q.get()), nullptr);
  as_role<SolvedFromInputs>(q).accumulate_inputs(x.narrow(0, 0, 200));  // in two batches: the running mean must add up
  as_role<SolvedFromInputs>(q).accumulate_inputs(x.narrow(0, 200, 312));
  as_role<SolvedFromInputs>(q).solve(w, 0);
  return q;
}

/// Symmetric int4 of `cols` [N, len] on per-row scales [N], float32 rounding as the quantizer
/// and export do it.
at::Tensor round_int4(const at::Tensor& cols, const at::Tensor& s) {
  return at::clamp(at::round(cols.to(at::kFloat) / s.to(at::kFloat).unsqueeze(1)), -8, 7).to(at::kDouble) *
         s.to(at::kFloat).to(at::kDouble).unsqueeze(1);
}

/// The reference: rows W [N, K], H = 2/n X^T X + damp, group parameters from the current
/// values at each group's first column (or from the original weight with act_order). With
/// `clip`, each row's group range is the full one shrunk by the factor among 1, 0.95, ..., 0.5
/// with the least (w - q)^T H_gg (w - q), H undamped.
at::Tensor reference_gptq(const at::Tensor& w_kn, const at::Tensor& x, double damp_frac, bool act_order,
                          bool clip = false) {
  at::Tensor w = w_kn.t().to(at::kDouble).clone();
  const at::Tensor xd = x.to(at::kDouble);
  at::Tensor h = 2.0 / double(x.size(0)) * xd.t().mm(xd);
  const at::Tensor h_undamped = h.clone();
  h.diagonal().add_(damp_frac * h.diagonal().mean().item<double>());
  const std::int64_t k = w.size(1);
  std::vector<std::int64_t> order(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) order[static_cast<std::size_t>(j)] = j;
  if (act_order) {
    const at::Tensor p = std::get<1>(h.diagonal().to(at::kFloat).sort(true, 0, true));
    for (std::int64_t j = 0; j < k; ++j) order[static_cast<std::size_t>(j)] = p[j].item<std::int64_t>();
  }
  auto full_range = [](const at::Tensor& cols, double shrink) {  // symmetric int4: scale = max|w| / 7.5
    const at::Tensor amax = at::maximum(cols.amin(1).clamp_max(0).abs(), cols.amax(1).clamp_min(0));
    return (amax * shrink * (2.0 / 15.0)).to(at::kFloat).clamp_min(kMinScale).to(at::kDouble);
  };
  auto params = [&](const at::Tensor& cols, std::int64_t first) {
    if (!clip) return full_range(cols, 1.0);
    const at::Tensor hg = h_undamped.narrow(0, first, kGroup).narrow(1, first, kGroup);
    at::Tensor best_s, best_e;
    for (int step = 0; step <= 10; ++step) {
      const at::Tensor s = full_range(cols, 1.0 - step / 20.0);
      const at::Tensor d = cols - round_int4(cols, s);
      const at::Tensor e = (d.mm(hg) * d).sum(1);
      if (step == 0) {
        best_s = s, best_e = e;
        continue;
      }
      best_s = at::where(e < best_e, s, best_s);
      best_e = at::minimum(e, best_e);
    }
    return best_s;
  };
  at::Tensor scales = at::empty({w.size(0), k / kGroup}, at::kDouble);
  if (act_order)
    for (std::int64_t g = 0; g < k / kGroup; ++g)
      scales.select(1, g).copy_(params(w.narrow(1, g * kGroup, kGroup), g * kGroup));
  at::Tensor hinv = at::inverse(h);
  at::Tensor q = at::zeros_like(w);
  std::vector<bool> done(static_cast<std::size_t>(k), false);
  for (std::int64_t step = 0; step < k; ++step) {
    const std::int64_t j = order[static_cast<std::size_t>(step)];
    if (!act_order && j % kGroup == 0) scales.select(1, j / kGroup).copy_(params(w.narrow(1, j, kGroup), j));
    const at::Tensor col = w.select(1, j);
    const at::Tensor qj = round_int4(col.unsqueeze(1), scales.select(1, j / kGroup)).squeeze(1);
    q.select(1, j).copy_(qj);
    done[static_cast<std::size_t>(j)] = true;
    // OBS: remove column j, spread its error over the rest, update the inverse.
    const at::Tensor e = (col - qj) / hinv[j][j];
    for (std::int64_t c = 0; c < k; ++c)
      if (!done[static_cast<std::size_t>(c)]) w.select(1, c).sub_(e * hinv[j][c]);
    hinv = hinv - at::outer(hinv.select(1, j), hinv.select(0, j)) / hinv[j][j];
  }
  return q.t().to(at::kFloat);
}

double output_error(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wq) {
  return (x.mm(w) - x.mm(wq)).pow(2).mean().item<double>();
}

TEST(Gptq, MatchesTheInverseHessianReferenceAndBeatsRoundToNearest) {
  auto [x, w] = layer_data();
  const QSpec spec = int4_groups();
  for (bool clip : {false, true})
    for (bool act_order : {false, true}) {
      SCOPED_TRACE(std::string("clip_search ") + (clip ? "true" : "false"));
      Options o("[w.quantizer_options]");
      o.set("act_order", act_order);
      o.set("clip_search", clip);
      o.set("grid", std::int64_t{20});
      o.set("max_shrink", 0.5);
      o.set("block_size", std::int64_t{32});  // two blocks: the lazy updates cross one boundary
      auto q = solved("gptq", o, w, x, spec);
      const at::Tensor ours = q->forward(w);
      const at::Tensor ref = reference_gptq(w, x, 0.01, act_order, clip);
      // Summation orders differ (Cholesky, float32), so a value near a rounding boundary may land
      // on the other side, and GPTQ carries that into the rest of its row: a few values differ,
      // far fewer than between round to nearest and the reference.
      auto share_differing = [&](const at::Tensor& a) {
        return (a - ref).abs().gt(1e-4).to(at::kDouble).mean().item<double>();
      };
      const at::Tensor rtn = fake_quantize(w, observed(w, spec), spec);
      EXPECT_LT(share_differing(ours), 0.1) << "act_order " << act_order;
      EXPECT_LT(share_differing(ours) * 4, share_differing(rtn)) << "act_order " << act_order;
      const double e_ours = output_error(x, w, ours), e_ref = output_error(x, w, ref);
      // A clip search may pick another of two nearly equal shrink factors in float than in double,
      // which moves that row's error by a few percent.
      EXPECT_NEAR(e_ours, e_ref, (clip ? 0.04 : 0.01) * e_ref) << "act_order " << act_order;
      const double e_rtn = output_error(x, w, rtn);
      EXPECT_LT(e_ours, 0.8 * e_rtn) << "act_order " << act_order << ": gptq " << e_ours << ", rtn " << e_rtn;

      // On the grid of its parameters: export's integers reproduce the solved weight exactly.
      const QParams p = q->qparams();
      ASSERT_EQ(p.scale.sizes(), (std::vector<std::int64_t>{kIn / kGroup, kOut}));
      const at::Tensor ints = quantize_to_int(ours, p, spec);
      EXPECT_TRUE(at::equal(fake_quantize(ints.to(at::kFloat) * expand_param(p.scale, w, spec), p, spec), ours));
      EXPECT_TRUE(at::equal(ints.to(at::kFloat) * expand_param(p.scale, w, spec), ours));
    }
}

TEST(Gptq, ARaggedLastGroupAndAGemmWeightAreHandled) {
  // K = 40 with groups of 16: the last group has 8 columns; the weight as Gemm's [N, K].
  auto [x_full, w_full] = layer_data();
  const at::Tensor x = x_full.narrow(1, 0, 40).contiguous(), w = w_full.narrow(0, 0, 40).t().contiguous();
  QSpec spec = int4_groups();
  spec.channel_axis = 0;
  spec.group_axis = 1;
  auto q = plugin().quantizer("gptq", spec);
  q->initialize(observed(w, spec));
  as_role<SolvedFromInputs>(q).accumulate_inputs(x);
  as_role<SolvedFromInputs>(q).solve(w, 1);
  const at::Tensor ours = q->forward(w);
  EXPECT_EQ(q->qparams().scale.sizes(), (std::vector<std::int64_t>{kOut, 3}));
  const double e_rtn = (x.mm(w.t()) - x.mm(fake_quantize(w, observed(w, spec), spec).t())).pow(2).mean().item<double>();
  const double e_ours = (x.mm(w.t()) - x.mm(ours.t())).pow(2).mean().item<double>();
  EXPECT_LT(e_ours, e_rtn);
  EXPECT_TRUE(at::equal(
      quantize_to_int(ours, q->qparams(), spec).to(at::kFloat) * expand_param(q->qparams().scale, w, spec), ours));
}

TEST(Gptq, AGroupWiderThanTheWeightIsOneRaggedGroup) {
  auto [x, w] = layer_data();
  for (std::int64_t axis : {0, 1}) {
    QSpec spec = int4_groups();
    spec.group_size = 128;  // > K = 64
    const at::Tensor wa = axis == 0 ? w : w.t().contiguous();
    if (axis == 1) spec.channel_axis = 0, spec.group_axis = 1;
    auto q = plugin().quantizer("gptq", spec);
    q->initialize(observed(wa, spec));
    as_role<SolvedFromInputs>(q).accumulate_inputs(x);
    as_role<SolvedFromInputs>(q).solve(wa, axis);
    const at::Tensor ours = q->forward(wa);
    EXPECT_EQ(q->qparams().scale.numel(), kOut);
    EXPECT_TRUE(at::equal(
        quantize_to_int(ours, q->qparams(), spec).to(at::kFloat) * expand_param(q->qparams().scale, wa, spec), ours))
        << "axis " << axis;
  }
}

TEST(Gptq, DeadInputsAndBadUseGiveClearErrors) {
  auto [x, w] = layer_data();
  x.select(1, 5).zero_();  // an input that is always zero: its weights do not matter
  auto q = solved("gptq", Options("[w.quantizer_options]"), w, x, int4_groups());
  EXPECT_TRUE(at::isfinite(q->forward(w)).all().item<bool>());
  EXPECT_TRUE(at::equal(q->forward(w).select(0, 5), at::zeros({kOut})));

  QSpec act;
  act.bits = 8;
  EXPECT_THROW(plugin().quantizer("gptq", act), Error);
  Options bad("[w.quantizer_options]");
  bad.set("damp", 0.0);
  EXPECT_THROW(plugin().quantizer("gptq", int4_groups(), bad), Error);
  auto unsolved = plugin().quantizer("gptq", int4_groups());
  unsolved->initialize(observed(w, int4_groups()));
  try {
    as_role<SolvedFromInputs>(unsolved).solve(w, 0);
    FAIL() << "solved without inputs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without layer inputs"), std::string::npos) << e.what();
  }
}

TEST(Rtn, ClipSearchLowersTheOutputErrorAndPlainRtnIsRoundToNearest) {
  auto [x, w] = layer_data();
  const QSpec spec = int4_groups();
  auto plain = plugin().quantizer("rtn", spec);
  plain->initialize(observed(w, spec));
  EXPECT_EQ(dynamic_cast<SolvedFromInputs*>(plain.get()), nullptr);
  EXPECT_TRUE(at::equal(plain->forward(w), fake_quantize(w, observed(w, spec), spec)));

  Options o("[w.quantizer_options]");
  o.set("clip_search", true);
  auto clipped = solved("rtn", o, w, x, spec);
  const at::Tensor ours = clipped->forward(w);
  const double e_rtn = output_error(x, w, plain->forward(w)), e_clip = output_error(x, w, ours);
  EXPECT_LT(e_clip, e_rtn);
  // Every group's scale is its full-range scale shrunk by one of the grid's factors.
  const at::Tensor full = observed(w, spec).scale, chosen = clipped->qparams().scale;
  const at::Tensor ratio = chosen / full;
  EXPECT_TRUE(at::all(ratio <= 1 + 1e-6).item<bool>());
  EXPECT_TRUE(at::all(ratio >= 0.5 - 1e-6).item<bool>());
  EXPECT_TRUE(at::any(ratio < 0.999).item<bool>()) << "the search never clipped";
  EXPECT_TRUE(at::equal(
      quantize_to_int(ours, clipped->qparams(), spec).to(at::kFloat) * expand_param(clipped->qparams().scale, w, spec),
      ours));
}

TEST(WeightRounding, PerChannelClipSearchKeepsTheSolvedWeightOnItsChosenGrid) {
  // Per-channel weights (no groups): the chosen per-row scales must become the parameters the
  // stored integers are read with, or the solved weight comes back on the observer's grid.
  auto [x, w] = layer_data();
  QSpec spec = int4_groups();
  spec.group_size = 0;
  const at::Tensor full = observed(w, spec).scale;
  for (const char* name : {"rtn", "gptq"}) {
    Options o("[w.quantizer_options]");
    o.set("clip_search", true);
    auto q = solved(name, o, w, x, spec);
    const at::Tensor ours = q->forward(w), scale = q->qparams().scale;
    ASSERT_EQ(scale.sizes(), full.sizes()) << name;
    EXPECT_TRUE(at::any(scale < full * 0.999).item<bool>()) << name << ": the search never clipped";
    EXPECT_TRUE(
        at::equal(quantize_to_int(ours, q->qparams(), spec).to(at::kFloat) * expand_param(scale, w, spec), ours))
        << name;
    const double e_plain = output_error(x, w, fake_quantize(w, observed(w, spec), spec));
    EXPECT_LT(output_error(x, w, ours), e_plain) << name;
  }
}

}  // namespace
}  // namespace sparsebit::testing
