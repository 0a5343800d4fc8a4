// kl_histogram against the published algorithm: on a fixed histogram (numpy, tests/observers/),
// and on ReLU-shaped and heavy-tailed data against the reference written below, which builds
// its own histogram of |x| from the values (exact zeros left out, Note [KL and the zero spike])
// and searches the threshold as TensorRT's entropy calibration describes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

/// The threshold (right edge of the chosen bin) for 8-bit symmetric data, 2048 bins of |x| over
/// [0, max|x|], in plain loops.
double reference_kl_threshold(const at::Tensor& x) {
  const at::Tensor v = x.to(at::kDouble).contiguous().reshape({-1});
  const double* d = v.data_ptr<double>();
  const std::int64_t n_values = v.numel(), bins = 2048, levels = 128;
  double amax = 0;
  for (std::int64_t k = 0; k < n_values; ++k) amax = std::max(amax, std::abs(d[k]));
  const double width = amax / double(bins);
  std::vector<double> hist(bins, 0.0);
  for (std::int64_t k = 0; k < n_values; ++k)
    if (d[k] != 0) hist[std::min<std::int64_t>(bins - 1, std::int64_t(std::abs(d[k]) / width))] += 1;
  std::int64_t last = bins;
  while (last > 0 && hist[last - 1] == 0) --last;
  double total = 0;
  for (double h : hist) total += h;
  double best_kl = std::numeric_limits<double>::infinity();
  std::int64_t best = last;
  for (std::int64_t i = levels; i <= last; ++i) {
    std::vector<double> p(hist.begin(), hist.begin() + i), q(i, 0.0);
    for (std::int64_t j = i; j < bins; ++j) p[i - 1] += hist[j];  // outliers clipped into the last bin
    const std::int64_t per_group = i / levels;
    for (std::int64_t g = 0; g < levels; ++g) {
      const std::int64_t a = g * per_group, b = g + 1 == levels ? i : a + per_group;
      double sum = 0, used = 0;
      for (std::int64_t j = a; j < b; ++j) sum += hist[j], used += hist[j] > 0;
      for (std::int64_t j = a; j < b; ++j) q[j] = hist[j] > 0 ? sum / used : 0;
    }
    double q_total = 0;
    for (double y : q) q_total += y;
    double kl = 0;
    for (std::int64_t j = 0; j < i; ++j) {
      if (p[j] == 0) continue;
      const double pj = p[j] / total, qj = q[j] > 0 ? q[j] / q_total : 1e-10;
      kl += pj * std::log(pj / qj);
    }
    if (kl < best_kl) best_kl = kl, best = i;
  }
  return double(best) * width;
}

/// Signal-to-quantization-noise ratio (dB) of x on the symmetric 8-bit grid of `scale`.
double sqnr_db(const at::Tensor& x, double scale) {
  const at::Tensor q = at::clamp(at::round(x / scale), -128, 127) * scale;
  return 10 * std::log10(x.pow(2).mean().item<double>() / (x - q).pow(2).mean().item<double>());
}

void expect_matches_reference(const at::Tensor& x, const char* what) {
  auto obs = make_observer("kl_histogram", symmetric8(true));
  obs->observe(x);
  const double scale = obs->compute().scale.item<double>();
  const double threshold = std::max(reference_kl_threshold(x), clipping_floor(x));
  const double bin = x.abs().max().item<double>() / 2048;
  // The observer bins x + R on a grid over [-R, R], the reference |x| over [0, R]: values on a
  // bin edge may land one bin apart, so the optimum may move by a bin.
  EXPECT_NEAR(scale * 127.5, threshold, 2 * bin) << what;  // symmetric: scale = 2 t / 255
}

TEST(Observers, KlLeavesTheZerosOfReLUDataOut) {
  at::manual_seed(3);
  // The positive half of a normal: half of the values are exactly 0.
  const at::Tensor relu = at::relu(at::randn({200000}));
  expect_matches_reference(relu, "relu");
  // Kept in, the zero spike pulled the threshold to 0.37 of the maximum (16 dB against minmax's
  // 39 dB); without it the search keeps most of the range.
  auto obs = make_observer("kl_histogram", symmetric8(true));
  obs->observe(relu);
  const double scale = obs->compute().scale.item<double>(), minmax = relu.max().item<double>() * 2 / 255;
  EXPECT_GT(scale, 0.7 * minmax);
  EXPECT_GT(sqnr_db(relu, scale), sqnr_db(relu, minmax) - 0.5);
  // Streaming in batches of growing range: within a few coarser bins of the one-shot result.
  auto streamed = make_observer("kl_histogram", symmetric8(false));
  for (const auto& chunk : std::get<0>(at::sort(relu)).chunk(16)) streamed->observe(chunk.reshape({-1, 1}));
  EXPECT_NEAR(streamed->compute().scale.item<double>(), obs->compute().scale.item<double>(),
              0.02 * obs->compute().scale.item<double>());
}

TEST(Observers, KlOnHeavyTailedDataMatchesTheReference) {
  at::manual_seed(4);
  // Student-t with 3 degrees of freedom (normal over the root of a scaled chi-square), and a
  // ReLU of it with a few large outliers.
  const at::Tensor z = at::randn({100000}), chi = at::randn({3, 100000}).pow(2).sum(0) / 3;
  const at::Tensor t3 = z / at::sqrt(chi);
  expect_matches_reference(t3, "student-t 3");
  const at::Tensor outliers = at::cat({at::relu(t3), at::full({20}, 40.0)});
  expect_matches_reference(outliers, "relu of student-t with outliers");
  // The 20 outliers (0.04% of the non-zero values, under the clipping floor's 0.1%) are clipped:
  // KL trades their error for resolution in the body.
  auto obs = make_observer("kl_histogram", symmetric8(true));
  obs->observe(outliers);
  EXPECT_LT(obs->compute().scale.item<double>() * 127.5, 0.9 * 40.0);
}

// Activations of PP-OCRv4's recognizer (observer_testing.h): TensorRT's search, the reference
// above, clips more than 0.1% of the values of at least one of them (with it the recognizer's
// exact-match was 0%); the observer's threshold is the reference's raised to the clipping floor.
TEST(Observers, KlKeepsTheClippingFloorOnARealRecognizersActivations) {
  bool beyond_floor = false;
  for (const auto& [what, x] : real_activations()) {
    const double reference = reference_kl_threshold(x);
    const double clipped =
        (x.abs() > reference).to(at::kDouble).sum().item<double>() / double((x != 0).sum().item<std::int64_t>());
    beyond_floor = beyond_floor || clipped > 1e-3;
    auto obs = make_observer("kl_histogram", symmetric8(false));
    for (const auto& chunk : x.chunk(16)) obs->observe(chunk);
    const double t = obs->compute().scale.item<double>() * 127.5;
    const double bin = x.abs().max().item<double>() / 2048;
    EXPECT_NEAR(t, std::max(reference, clipping_floor(x)), 2 * bin) << what;
  }
  EXPECT_TRUE(beyond_floor);
}

TEST(Observers, KlMatchesTheTensorRTAlgorithmOnAFixedHistogram) {
  // The numpy reference's threshold, raised to the clipping floor (Note [Clipping floor]).
  const auto& range = reference().values["kl_histogram"];
  const double t =
      std::max({std::abs(range[0].get<double>()), std::abs(range[1].get<double>()), clipping_floor(reference().data)});
  auto expected = [&](const QSpec& spec) {
    return qparams_from_range(at::scalar_tensor(-t), at::scalar_tensor(t), spec, "kl reference");
  };
  // One observe call: the histogram spans exactly [-max|x|, max|x|] in 4096 bins, the same bins
  // the reference builds, so the threshold must agree to a bin.
  expect_scale_near(observe_exact("kl_histogram"), expected(symmetric8(true)), 1e-3, "kl");
  // Streaming: the range doubled while batches arrived, so bins are coarser; still close.
  expect_scale_near(observe_streaming("kl_histogram"), expected(symmetric8(false)), 5e-2, "kl streaming");
  // KL with its floor still clips the outliers that minmax keeps.
  EXPECT_LT(observe_exact("kl_histogram").scale.item<double>(), observe_exact("minmax").scale.item<double>() * 0.9);
}

}  // namespace
}  // namespace sparsebit::testing
