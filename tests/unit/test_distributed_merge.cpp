// Note [Distributed observers] (sdk/observer.h): an observer fed part of the data in each of
// several processes, merged in rank order, must give one process's parameters: exactly for
// minmax and for the histogram counts, whatever the split. The GPTQ Hessian merges as the
// sample-weighted mean. (The multi-process runs themselves: tests/distributed/.)

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "observer_testing.h"
#include "quantizer_testing.h"

namespace sparsebit::testing {
namespace {

// Batches of growing and shrinking magnitude, a per-channel layout [N, C, L] and exact zeros:
// the histogram's range grows several times in one order and not in another.
std::vector<at::Tensor> batches() {
  at::manual_seed(31);
  std::vector<at::Tensor> out;
  for (double m : {0.3, 5.0, 0.01, 40.0, 2.0, 0.7, 130.0, 1.0}) {
    at::Tensor x = at::randn({4, 3, 50}) * m;
    x.index_put_({at::indexing::Slice(), 1, at::indexing::Slice(0, 5)}, 0.0);
    out.push_back(x);
  }
  return out;
}

QSpec activation_spec(bool per_channel) {
  QSpec s = symmetric8(false);
  s.symmetric = false;
  if (per_channel) {
    s.per_channel = true;
    s.channel_axis = 1;
  }
  return s;
}

/// Observes every batch in one observer, and batch b in "process" b % parts, then merges.
void expect_merge_is_exact(const std::string& name, bool per_channel, int parts) {
  const QSpec spec = activation_spec(per_channel);
  auto whole = make_observer(name, spec);
  std::vector<std::unique_ptr<Observer>> shards;
  for (int p = 0; p < parts; ++p) shards.push_back(make_observer(name, spec));
  const auto data = batches();
  for (std::size_t b = 0; b < data.size(); ++b) {
    whole->observe(data[b]);
    shards[b % static_cast<std::size_t>(parts)]->observe(data[b]);
  }
  ASSERT_NE(dynamic_cast<MergeableObserver*>(whole.get()), nullptr) << name;
  auto merged = make_observer(name, spec);
  for (auto& s : shards) role<MergeableObserver>(merged).merge(role<MergeableObserver>(s).state());
  const auto a = role<MergeableObserver>(whole).state(), m = role<MergeableObserver>(merged).state();
  ASSERT_EQ(a.size(), m.size()) << name;
  for (std::size_t i = 0; i < a.size(); ++i) {
    // Counts, minimum, maximum, zeros and shapes exactly; the double sums to rounding.
    if (a[i].scalar_type() == at::kDouble && a[i].dim() == 1 && i % 6 == 3)
      EXPECT_TRUE(at::allclose(a[i], m[i], 1e-12, 0)) << name << " state " << i;
    else
      EXPECT_TRUE(at::equal(a[i], m[i])) << name << " state " << i << " of " << a.size() << " (" << parts << " parts)";
  }
  const QParams pa = whole->compute(), pm = merged->compute();
  EXPECT_TRUE(at::equal(pa.scale, pm.scale)) << name << ": " << pa.scale << " vs merged " << pm.scale;
  EXPECT_TRUE(at::equal(pa.zero_point, pm.zero_point)) << name;
}

TEST(DistributedMerge, ObserverStatesMergeIntoOneProcesssParameters) {
  for (const char* name : {"minmax", "percentile", "mse", "aciq", "kl_histogram"})
    for (int parts : {2, 3}) expect_merge_is_exact(name, false, parts);
  for (const char* name : {"minmax", "percentile", "mse", "kl_histogram"}) expect_merge_is_exact(name, true, 2);
}

// The histogram's counts do not depend on how the data came: they are the counts of all the
// values on the grid of the smallest power of two above max |x| (Note [Streaming histogram]),
// here written out with ATen's floor and bincount.
TEST(DistributedMerge, HistogramCountsAreThoseOfAllTheDataOnAPowerOfTwoGrid) {
  auto obs = make_observer("percentile", activation_spec(false));
  at::Tensor all;
  for (const auto& b : batches()) {
    obs->observe(b);
    all = all.defined() ? at::cat({all, b.reshape({-1})}) : b.reshape({-1});
  }
  const auto state = role<MergeableObserver>(obs).state();
  const double amax = all.abs().max().item<double>();
  const double range = std::exp2(std::floor(std::log2(amax)) + 1);
  ASSERT_EQ(state.back().dim(), 1);
  const at::Tensor counts = state[0].reshape({-1});
  const std::int64_t bins = counts.numel();
  EXPECT_EQ(state[5][0].item<double>(), range);
  const at::Tensor idx =
      at::floor((all.to(at::kDouble) + range) / (2 * range / double(bins))).clamp(0, bins - 1).to(at::kLong);
  EXPECT_TRUE(at::equal(counts, at::bincount(idx, {}, bins).to(at::kDouble)));
}

// An observer without the hook says so, and merging a nothing-observed state changes nothing.
TEST(DistributedMerge, EmptyStatesMergeToNothing) {
  auto a = make_observer("minmax", activation_spec(false));
  EXPECT_TRUE(role<MergeableObserver>(a).state().empty());
  role<MergeableObserver>(a).merge({});
  EXPECT_THROW(a->compute(), Error);
  EXPECT_EQ(dynamic_cast<MergeableObserver*>(make_observer("moving_average", activation_spec(false)).get()), nullptr);
}

// GPTQ's running-mean Hessian: the halves merged equal the whole, and the solved weights agree.
TEST(DistributedMerge, GptqHessiansMergeAsTheMeanOverAllSamples) {
  at::manual_seed(5);
  const at::Tensor weight = at::randn({32, 16});  // [K, N]: reduction along axis 0, as MatMul's
  std::vector<at::Tensor> rows;
  for (int b = 0; b < 6; ++b) rows.push_back(at::randn({10 + 3 * b, 32}));
  QSpec spec = symmetric8(true);
  spec.bits = 4;
  auto make = [&] {
    auto observer = make_observer("minmax", spec);
    observer->observe(weight);
    auto q = make_quantizer("gptq", spec);
    q->initialize(observer->compute());
    return q;
  };
  auto whole = make(), first = make(), second = make(), merged = make();
  for (std::size_t b = 0; b < rows.size(); ++b) {
    role<SolvedFromInputs>(whole).accumulate_inputs(rows[b]);
    role<SolvedFromInputs>(b % 2 ? second : first).accumulate_inputs(rows[b]);
    role<SolvedFromInputs>(merged).accumulate_inputs(rows[b].narrow(0, 0, 1));  // replaced by the merge
  }
  ASSERT_NE(dynamic_cast<MergesInputs*>(merged.get()), nullptr);
  const auto a_half = role<MergesInputs>(first).input_state(), b_half = role<MergesInputs>(second).input_state();
  role<MergesInputs>(merged).merge_inputs(
      {a_half[0] + b_half[0], a_half[1] + b_half[1]});  // what the runner's sum gives
  const auto w = role<MergesInputs>(whole).input_state(), m = role<MergesInputs>(merged).input_state();
  EXPECT_EQ(w[1].item<double>(), m[1].item<double>());
  EXPECT_TRUE(at::allclose(w[0], m[0], 1e-5, 1e-4)) << (w[0] - m[0]).abs().max();
  role<SolvedFromInputs>(whole).solve(weight, 0);
  role<SolvedFromInputs>(merged).solve(weight, 0);
  const at::Tensor a = whole->forward(weight), b = merged->forward(weight);
  EXPECT_GT((a == b).to(at::kFloat).mean().item<double>(), 0.99);
}

}  // namespace
}  // namespace sparsebit::testing
