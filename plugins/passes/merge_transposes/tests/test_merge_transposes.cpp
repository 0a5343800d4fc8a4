// merge_transposes: composed permutations, and inverse ones cancelled.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Passes, MergeTransposesTemplate) {
  Builder b({2, 3, 4});
  b.add("t1", "Transpose", {"x"}, {"a"}, {{"perm", Attribute::of_ints({1, 2, 0})}});
  b.add("t2", "Transpose", {"a"}, {"y"}, {{"perm", Attribute::of_ints({0, 2, 1})}});
  Graph g = apply_and_compare(b.g, "merge_transposes", at::randn({2, 3, 4}));
  ASSERT_EQ(ops(g), (std::vector<std::string>{"Transpose"}));
  EXPECT_EQ(g.node(0).attr_ints("perm"), (std::vector<std::int64_t>{1, 0, 2}));
  // Inverse permutations cancel; the consumer then reads x directly.
  Builder c({2, 3, 4});
  c.add("t1", "Transpose", {"x"}, {"a"}, {{"perm", Attribute::of_ints({1, 2, 0})}});
  c.add("t2", "Transpose", {"a"}, {"b"}, {{"perm", Attribute::of_ints({2, 0, 1})}});
  c.add("relu", "Relu", {"b"}, {"y"});
  Graph h = apply_and_compare(c.g, "merge_transposes", at::randn({2, 3, 4}));
  EXPECT_EQ(ops(h), (std::vector<std::string>{"Relu"}));
}

}  // namespace
}  // namespace sparsebit::testing
