// auto against hand computations: its candidates are the ranges the other observers compute
// (minmax exactly; percentiles within a bin of torch's order statistics; mse no worse than
// minmax), grids that coincide are offered once, and compute() is the candidate with the least
// squared error on the data itself (within the histogram's resolution).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

QSpec affine8() {
  QSpec s;
  s.symmetric = false;
  return s;
}

/// Data with a few far outliers: ranges differ a lot between minmax and the clipping rules.
at::Tensor outlier_data() {
  at::manual_seed(7);
  at::Tensor x = at::randn({64, 1000});
  x.view({-1}).narrow(0, 0, 20).fill_(40.0f);
  return x;
}

const RangeCandidate* find(const std::vector<RangeCandidate>& all, const std::string& name) {
  for (const auto& c : all)
    if (c.name == name) return &c;
  return nullptr;
}

TEST(AutoObserver, CandidatesAreTheOtherObserversRanges) {
  const QSpec spec = affine8();
  auto obs = make_observer("auto", spec);
  const at::Tensor x = outlier_data();
  obs->observe(x.narrow(0, 0, 32));
  obs->observe(x.narrow(0, 32, 32));
  const auto all = role<OffersRanges>(obs).candidates();
  ASSERT_GE(all.size(), 3u);
  EXPECT_EQ(all.front().name, "minmax");

  const double lo = x.min().item<double>(), hi = x.max().item<double>();
  const QParams mm = qparams_from_range(at::scalar_tensor(lo), at::scalar_tensor(hi), spec, "hand");
  EXPECT_FLOAT_EQ(all.front().params.scale.item<float>(), mm.scale.item<float>());
  EXPECT_EQ(all.front().params.zero_point.item<int>(), mm.zero_point.item<int>());

  // percentile 1e-4: the order statistics torch gives, within one histogram bin (8,192 bins
  // over the power of two above 40).
  const RangeCandidate* p = find(all, "percentile 0.0001");
  ASSERT_NE(p, nullptr);
  const at::Tensor flat = x.reshape({-1}).to(at::kDouble);
  const double n = double(flat.numel()), n_neg = (flat < 0).sum().item<double>();
  const double k_hi = n - std::round((n - n_neg) * 1e-4), k_lo = std::max(std::round(n_neg * 1e-4), 1.0);
  const double q_hi = std::get<0>(at::kthvalue(flat, std::int64_t(k_hi))).item<double>();
  const double q_lo = std::get<0>(at::kthvalue(flat, std::int64_t(k_lo))).item<double>();
  const double bin = 2 * 64.0 / 8192;
  const double scale = p->params.scale.item<double>();
  EXPECT_NEAR(scale, (q_hi - q_lo) / 255, 2 * bin / 255);

  // mse: no worse than minmax on the data itself.
  const RangeCandidate* m = find(all, "mse");
  const auto exact_error = [&](const QParams& p) {
    return (fake_quantize(x, p, spec) - x).pow(2).sum().item<double>();
  };
  if (m) EXPECT_LE(exact_error(m->params), exact_error(all.front().params));

  // No two candidates share a grid.
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = i + 1; j < all.size(); ++j)
      EXPECT_FALSE(std::abs(all[i].params.scale.item<double>() / all[j].params.scale.item<double>() - 1) < 1e-3 &&
                   all[i].params.zero_point.item<int>() == all[j].params.zero_point.item<int>())
          << all[i].name << " and " << all[j].name;
}

TEST(AutoObserver, ComputeIsTheCandidateWithTheLeastErrorOnTheData) {
  const QSpec spec = affine8();
  auto obs = make_observer("auto", spec);
  const at::Tensor x = outlier_data();
  obs->observe(x);
  const auto all = role<OffersRanges>(obs).candidates();
  double best = std::numeric_limits<double>::infinity();
  double best_scale = 0;
  for (const auto& c : all) {
    const double err = (fake_quantize(x, c.params, spec) - x).pow(2).sum().item<double>();
    if (err < best) best = err, best_scale = c.params.scale.item<double>();
  }
  const QParams chosen = obs->compute();
  const double chosen_err = (fake_quantize(x, chosen, spec) - x).pow(2).sum().item<double>();
  // The histogram's bin centres stand for the values: the choice is the best within 2%.
  EXPECT_LE(chosen_err, 1.02 * best) << "chosen scale " << chosen.scale.item<double>() << ", best " << best_scale;
  const double minmax_err = (fake_quantize(x, all.front().params, spec) - x).pow(2).sum().item<double>();
  EXPECT_LT(best, minmax_err);
}

TEST(AutoObserver, WeightsTakeTheirMinAndMaxAndOfferNothing) {
  QSpec spec = symmetric8(true);
  spec.per_channel = true;
  spec.channel_axis = 0;
  auto obs = make_observer("auto", spec);
  obs->observe(at::tensor({1.0f, -4.0f, -2.0f, 0.5f}).reshape({2, 2}));
  EXPECT_TRUE(role<OffersRanges>(obs).candidates().empty());
  const QParams p = obs->compute();
  EXPECT_FLOAT_EQ(p.scale[0].item<float>(), 2 * 4.0f / 255);
  EXPECT_FLOAT_EQ(p.scale[1].item<float>(), 2 * 2.0f / 255);
}

TEST(AutoObserver, NothingObservedIsAnError) {
  auto obs = make_observer("auto", affine8());
  EXPECT_THROW(role<OffersRanges>(obs).candidates(), Error);
  EXPECT_THROW(obs->compute(), Error);
}

}  // namespace
}  // namespace sparsebit::testing
