// Note [Choosing ranges by the consuming layer]: with the auto observer, each quantized input
// takes the candidate range under which its layer's output is closest to float (relative per
// output slice), checked against the same errors computed here by hand, where held-out samples
// confirm it at the model's output (Note [Choices judged at the output]); a range that looks best
// to its layer on the samples it was chosen on but hurts the output on the next is not taken;
// without the selection (range_samples = 0) or without held-out samples the observer keeps the
// candidate with the least error on the tensor itself.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"
#include "test_support.h"

namespace sparsebit {
namespace {

// y = x @ W: channels 0-2 of x are N(0, 1) and reach the output with tiny weights; channel 3 is
// small but for one value of 30, and reaches the output with weight 1. The tensor's own error
// favours clipping that value (its rounding noise covers all 262,144 values); the output needs it.
// The file holds x three times: the ranges are chosen on the first (range_samples = 65,536
// rows) and judged on the two others, which the outlier reaches as well.
struct OutlierLayer {
  testing::TempDir dir;
  at::Tensor x, w;
  OutlierLayer() {
    at::manual_seed(11);
    x = at::randn({65536, 4});
    x.select(1, 3).mul_(0.1);
    x.select(1, 3)[5] = 30.0f;
    w = at::tensor({0.01f, -0.01f, 0.02f, 1.0f}).reshape({4, 1});
    write_npy(at::cat({x, x, x}), dir / "x.npy");
  }
  Model model() const {
    testing::Builder b({-1, 4});
    b.constant("w", w.clone());
    b.add("mm", "MatMul", {"x", "w"}, {"y"});
    Model m;
    m.graph = std::move(b.g);
    return m;
  }
  Config config(int range_samples) const {
    Config c;
    c.backend = "virtual";
    c.calibration.batch_size = 16384;
    c.calibration.range_samples = range_samples;
    c.plugins.use_environment = false;
    return c;
  }
};

double relative_output_error(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).pow(2).sum() / want.pow(2).sum()).item<double>();
}

TEST(RangeSelection, TheInputTakesTheCandidateItsLayerDoesBestWith) {
  OutlierLayer t;
  QuantModel qm(t.model(), t.config(65536), testing::shipped_registry());
  auto data = open_dataset(t.dir.path().string(), qm.graph().inputs);
  const CalibrationStats stats = qm.calibrate(*data);
  EXPECT_EQ(stats.range_selection_samples, 65536);
  EXPECT_EQ(stats.range_selected_inputs, 1u);
  EXPECT_EQ(stats.range_judged_samples, 2 * 65536);
  EXPECT_EQ(stats.range_departures, 1u);
  EXPECT_EQ(stats.range_kept_departures, 1u);
  EXPECT_LT(stats.range_output_error_kept, stats.range_output_error_default);
  const QuantSlot* act = nullptr;
  const QuantSlot* weight = nullptr;
  for (const auto& s : qm.slots()) (s.role == InputRole::kActivation ? act : weight) = &s;
  ASSERT_NE(act, nullptr);
  ASSERT_NE(weight, nullptr);

  // The same candidates from a fresh observer on the same data, and each one's layer error.
  const auto* e = testing::shipped_registry().observer("auto");
  ASSERT_NE(e, nullptr);
  Options none("[test]");
  auto obs = e->factory(ObserverContext{act->spec, none, "test"});
  for (int copy = 0; copy < 3; ++copy)
    for (const auto& chunk : t.x.split(16384)) obs->observe(chunk);
  const auto candidates = testing::role<OffersRanges>(obs).candidates();
  ASSERT_GE(candidates.size(), 2u);
  const at::Tensor wq = fake_quantize(t.w, weight->quantizer->qparams(), weight->spec);
  const at::Tensor y = at::matmul(t.x, t.w);
  std::string best;
  double best_error = std::numeric_limits<double>::infinity(), minmax_error = 0, own_choice_error = 0;
  const QParams own = obs->compute();
  for (const auto& c : candidates) {
    const double err = relative_output_error(at::matmul(fake_quantize(t.x, c.params, act->spec), wq), y);
    if (err < best_error) best_error = err, best = c.name;
    if (c.name == "minmax") minmax_error = err;
    if (at::allclose(c.params.scale, own.scale)) own_choice_error = err;
  }
  EXPECT_EQ(act->range, best);
  EXPECT_EQ(best, "minmax");
  EXPECT_DOUBLE_EQ(best_error, minmax_error);
  EXPECT_GT(own_choice_error, 1.1 * best_error) << "the tensor's own error should have clipped the outlier";
  EXPECT_FLOAT_EQ(act->quantizer->qparams().scale.item<float>(), candidates.front().params.scale.item<float>());

  // The quantized model agrees with that hand computation.
  qm.set_quant(true, true);
  const at::Tensor q = qm.forward({t.x})[0];
  EXPECT_NEAR(relative_output_error(q, y), best_error, 1e-6);
}

// Rows of 64 values [S, 64, 4] through y = x @ W, channel 3 reaching the output with weight 1.
// The first 32 samples (those the ranges are chosen on) are plain N(0, 1); among the rest, one
// sample in 14 carries a value of 30 in channel 3 (16 values of 65,536: rarer than the
// 1e-3 tail, common enough for the tensor's own error to keep them). On the first 32 the layer
// does best with the sharpest clip; on the next 64, which hold five of the large values, that
// clip loses them and the output is worse than with the observer's own range.
TEST(RangeSelection, AClipThatFitsOnlyTheChoosingSamplesIsNotKept) {
  testing::TempDir dir;
  at::manual_seed(5);
  at::Tensor x = at::randn({256, 64, 4});
  for (std::int64_t s = 32 + 7, n = 0; s < 256 && n < 16; s += 14, ++n) x[s][n % 64][3] = 30.0f;
  write_npy(x, dir / "x.npy");
  const at::Tensor w = at::tensor({0.01f, -0.01f, 0.02f, 1.0f}).reshape({4, 1});
  testing::Builder b({-1, 64, 4});
  b.constant("w", w.clone());
  b.add("mm", "MatMul", {"x", "w"}, {"y"});
  Model m;
  m.graph = std::move(b.g);
  Config c;
  c.backend = "virtual";
  c.calibration.batch_size = 32;
  c.calibration.range_samples = 32;
  c.plugins.use_environment = false;
  QuantModel qm(std::move(m), c, testing::shipped_registry());
  auto data = open_dataset(dir.path().string(), qm.graph().inputs);
  const CalibrationStats stats = qm.calibrate(*data);
  ASSERT_EQ(stats.range_selected_inputs, 1u);
  EXPECT_EQ(stats.range_judged_samples, 64);
  const QuantSlot* act = nullptr;
  const QuantSlot* weight = nullptr;
  for (const auto& s : qm.slots()) (s.role == InputRole::kActivation ? act : weight) = &s;
  ASSERT_NE(act, nullptr);

  // By hand: the candidates of an observer that saw all of x, the layer's error of each on the
  // first 32 samples and the output error of each on the next 64.
  Options none("[test]");
  auto obs = testing::shipped_registry().observer("auto")->factory(ObserverContext{act->spec, none, "test"});
  for (const auto& chunk : x.split(32)) obs->observe(chunk);
  const auto candidates = testing::role<OffersRanges>(obs).candidates();
  const QParams own = obs->compute();
  const at::Tensor wq = fake_quantize(w, weight->quantizer->qparams(), weight->spec);
  const at::Tensor chosen_on = x.narrow(0, 0, 32), judged_on = x.narrow(0, 32, 64);
  std::string layer_best;
  double least = std::numeric_limits<double>::infinity(), held_out_best = 0, held_out_own = 0;
  for (const auto& cand : candidates) {
    const double err = relative_output_error(at::matmul(fake_quantize(chosen_on, cand.params, act->spec), wq),
                                             at::matmul(chosen_on, w));
    const double held = relative_output_error(at::matmul(fake_quantize(judged_on, cand.params, act->spec), wq),
                                              at::matmul(judged_on, w));
    if (err < least) least = err, layer_best = cand.name, held_out_best = held;
    if (at::allclose(cand.params.scale, own.scale)) held_out_own = held;
  }
  ASSERT_NE(layer_best, "minmax") << "the fixture needs the layer to prefer a clip on the first samples";
  ASSERT_GT(held_out_best, 2 * held_out_own) << "the fixture needs that clip to hurt the held-out output";
  EXPECT_EQ(stats.range_departures, 1u);
  EXPECT_EQ(stats.range_kept_departures, 0u);
  EXPECT_NE(act->range, layer_best);
  EXPECT_TRUE(at::allclose(act->quantizer->qparams().scale, own.scale)) << "the observer's own range stays";
  EXPECT_NEAR(stats.range_output_error_default, held_out_own, 1e-6);
}

// With every sample choosing, none is left to judge on: the observer's own range stays.
TEST(RangeSelection, WithoutHeldOutSamplesTheObserversOwnChoiceStays) {
  OutlierLayer t;
  QuantModel qm(t.model(), t.config(3 * 65536), testing::shipped_registry());
  auto data = open_dataset(t.dir.path().string(), qm.graph().inputs);
  const CalibrationStats stats = qm.calibrate(*data);
  EXPECT_EQ(stats.range_selected_inputs, 1u);
  EXPECT_EQ(stats.range_judged_samples, 0);
  EXPECT_EQ(stats.range_departures, 1u);
  EXPECT_EQ(stats.range_kept_departures, 0u);
  for (const auto& s : qm.slots())
    if (s.role == InputRole::kActivation) EXPECT_LT(s.quantizer->qparams().scale.item<double>() * 127, 20.0);
}

TEST(RangeSelection, WithoutSamplesTheObserversOwnChoiceStays) {
  OutlierLayer t;
  QuantModel qm(t.model(), t.config(0), testing::shipped_registry());
  auto data = open_dataset(t.dir.path().string(), qm.graph().inputs);
  const CalibrationStats stats = qm.calibrate(*data);
  EXPECT_EQ(stats.range_selected_inputs, 0u);
  for (const auto& s : qm.slots()) {
    if (s.role != InputRole::kActivation) continue;
    EXPECT_TRUE(s.range.empty());
    // The clipped range: far below the outlier's 30.
    EXPECT_LT(s.quantizer->qparams().scale.item<double>() * 127, 20.0);
  }
}

TEST(RangeSelection, RangeSamplesIsCheckedInTheConfig) {
  testing::TempDir dir;
  std::ofstream(dir / "c.toml") << "[calibration]\nrange_samples = -1\n";
  const std::string msg = testing::error_of([&] { Config::from_file(dir / "c.toml"); });
  EXPECT_NE(msg.find("range_samples"), std::string::npos) << msg;
  std::ofstream(dir / "d.toml") << "[calibration]\nrange_samples = 3\n";
  EXPECT_EQ(Config::from_file(dir / "d.toml").calibration.range_samples, 3);
  EXPECT_EQ(Config().a.observer, "auto");
  EXPECT_EQ(Config().w.observer, "minmax");
}

}  // namespace
}  // namespace sparsebit
