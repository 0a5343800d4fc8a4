// l1_unstructured: the smallest |w| are zeroed, to the ratio, and the kept weights are unchanged.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "prune_testing.h"

namespace sparsebit::testing {
namespace {

TEST(L1Unstructured, ElementSparsityHitsTheRatioAndZeroesTheSmallestWeights) {
  Builder b({1, 4, 5, 5});
  at::manual_seed(1);
  b.constant("w", at::randn({8, 4, 3, 3}));
  b.add("conv", "Conv", {"x", "w"}, {"y"});
  auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_unstructured\"\nratio = 0.3\n", {1, 4, 5, 5});
  const at::Tensor w = b.g.initializers.at("w"), p = r.pruned.graph.initializers.at("w");
  const std::int64_t zeros = (p == 0).sum().item<std::int64_t>();
  EXPECT_EQ(zeros, static_cast<std::int64_t>(std::floor(0.3 * 288)));  // 86
  // Every zeroed weight is no larger than every kept one, and kept ones are unchanged.
  EXPECT_LE(w.abs().masked_select(p == 0).max().item<double>(), w.abs().masked_select(p != 0).min().item<double>());
  EXPECT_TRUE(at::equal(p.masked_select(p != 0), w.masked_select(p != 0)));
  ASSERT_EQ(r.layers.size(), 1u);
  EXPECT_NEAR(r.layers[0].sparsity, 86.0 / 288, 1e-12);
  EXPECT_EQ(r.after.nonzero_parameters, 288 - 86);
  // MACs of the 3x3 conv on 5x5 (no padding): 8 x 3 x 3 positions x 4 x 3 x 3.
  EXPECT_EQ(r.before.macs, 8 * 9 * 36);
  EXPECT_EQ(r.after.sparse_macs, std::llround(8 * 9 * 36 * (288.0 - 86) / 288));
}

}  // namespace
}  // namespace sparsebit::testing
