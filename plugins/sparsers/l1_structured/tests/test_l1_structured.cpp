// l1_structured: a filter's score is the sum of |w| over everything but its output channel, and
// pruning removes the filters of least score with the next layer's matching input channels.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "prune_testing.h"

namespace sparsebit::testing {
namespace {

TEST(L1Structured, RemovesTheFiltersOfLeastL1NormAndTheInputsThatReadThem) {
  // Four 1x1 filters over two input channels; their L1 norms by hand: 3, 0.5, 7, 2.
  Builder b({1, 2, 3, 3});
  b.constant("w", at::tensor({1.0f, -2.0f, 0.25f, 0.25f, -3.0f, 4.0f, 1.5f, -0.5f}).reshape({4, 2, 1, 1}));
  b.constant("next", at::arange(12, at::kFloat).reshape({3, 4, 1, 1}));
  b.add("c1", "Conv", {"x", "w"}, {"a"});
  b.add("relu", "Relu", {"a"}, {"r"});
  b.add("c2", "Conv", {"r", "next"}, {"y"});
  const auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n", {1, 2, 3, 3});
  EXPECT_EQ(r.channels_removed, 2);
  // Filters 2 (norm 7) and 0 (norm 3) stay, in their order; c2 keeps its input channels 0 and 2.
  const at::Tensor w = b.g.initializers.at("w"), next = b.g.initializers.at("next");
  EXPECT_TRUE(at::equal(r.pruned.graph.initializers.at("w"), at::stack({w[0], w[2]})));
  EXPECT_TRUE(at::equal(r.pruned.graph.initializers.at("next"), at::stack({next.select(1, 0), next.select(1, 2)}, 1)));
}

}  // namespace
}  // namespace sparsebit::testing
