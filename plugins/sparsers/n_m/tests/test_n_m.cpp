// n_m: in every M consecutive weights along the input axis the N largest |w| stay; layers whose
// input channels M does not divide are left dense, with a note.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "prune_testing.h"

namespace sparsebit::testing {
namespace {

TEST(NM, TwoOfFourKeepsTheTwoLargestOfEveryFourInputChannels) {
  Builder b({2, 16, 4, 4});
  at::manual_seed(3);
  b.constant("w", at::randn({8, 16, 3, 3}));
  b.constant("w_first", at::randn({16, 3, 1, 1}));  // 3 input channels: not a multiple of 4
  b.constant("fc", at::randn({8 * 2 * 2, 12}));     // MatMul weight [K, N]: input axis 0
  b.add("first", "Conv", {"x", "w"}, {"a"});
  b.add("flat", "Flatten", {"a"}, {"f"});
  b.add("fc", "MatMul", {"f", "fc"}, {"y"});
  auto r = run_prune(b.g, "[sparse]\nsparser = \"n_m\"\n", {2, 16, 4, 4});
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.m, 4);
  auto check = [](const at::Tensor& original, const at::Tensor& pruned, std::int64_t input_axis) {
    at::Tensor o = original.movedim(input_axis, -1).reshape({-1, 4}),
               p = pruned.movedim(input_axis, -1).reshape({-1, 4});
    for (std::int64_t g = 0; g < o.size(0); ++g) {
      auto kept = (p[g] != 0).nonzero().flatten();
      ASSERT_EQ(kept.numel(), 2);
      auto top = std::get<1>(o[g].abs().topk(2));
      EXPECT_TRUE(at::equal(std::get<0>(kept.sort()), std::get<0>(top.sort()))) << "group " << g;
    }
  };
  check(b.g.initializers.at("w"), r.pruned.graph.initializers.at("w"), 1);
  check(b.g.initializers.at("fc"), r.pruned.graph.initializers.at("fc"), 0);
}

TEST(NM, LeavesLayersWhoseInputChannelsDoNotDivideDense) {
  Builder b({1, 3, 4, 4});
  b.constant("w", at::randn({8, 3, 3, 3}));
  b.add("rgb", "Conv", {"x", "w"}, {"y"});
  auto r = run_prune(b.g, "[sparse]\nsparser = \"n_m\"\ngranularity = \"1:4\"\n", {1, 3, 4, 4});
  EXPECT_TRUE(at::equal(r.pruned.graph.initializers.at("w"), b.g.initializers.at("w")));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("not a multiple of 4"), std::string::npos) << r.notes[0];
}

}  // namespace
}  // namespace sparsebit::testing
