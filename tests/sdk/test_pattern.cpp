// The SDK's pattern matcher: overlaps, any-order inputs, checks, external uses, repeated rewrites.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::testing {
namespace {

TEST(Pattern, MatchesDoNotOverlap) {
  Builder three = relu_chain(3), four = relu_chain(4);
  EXPECT_EQ(relu_pair().find(three.g).size(), 1u);
  auto m = relu_pair().find(four.g);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].at("a")->name, "relu0");
  EXPECT_EQ(m[1].at("a")->name, "relu2");
}

TEST(Pattern, AnyOrderMatchesEitherOperandOrderedOnlyItsPosition) {
  for (bool mul_first : {true, false}) {
    Builder b({4});
    b.constant("c", at::ones({4}));
    b.add("mul", "Mul", {"x", "x"}, {"m"});
    b.add("add", "Add", mul_first ? std::vector<std::string>{"m", "c"} : std::vector<std::string>{"c", "m"}, {"y"});
    Pattern any, ordered;
    any.node("mul", {"Mul"});
    any.node("add", {"Add"}, {"mul"}, Pattern::Inputs::kAnyOrder);
    ordered.node("mul", {"Mul"});
    ordered.node("add", {"Add"}, {"mul"});
    EXPECT_EQ(any.find(b.g).size(), 1u);
    EXPECT_EQ(ordered.find(b.g).size(), mul_first ? 1u : 0u);
  }
}

TEST(Pattern, NodeAndJointChecksFilter) {
  Builder b = relu_chain(4);
  Pattern only_first;
  only_first.node("a", {"Relu"}, {}, Pattern::Inputs::kOrdered,
                  [](const Node& n, const Graph&) { return n.name != "relu0"; });
  only_first.node("b", {"Relu"}, {"a"});
  auto m = only_first.find(b.g);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].at("a")->name, "relu1");
  Pattern joint = relu_pair();
  joint.joint([](const Match& mm, const Graph&) { return mm.at("b")->name == "relu3"; });
  m = joint.find(b.g);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].at("a")->name, "relu2");
  Pattern wildcard;
  wildcard.node("any", {});
  wildcard.node("b", {"Relu"}, {"any"});
  EXPECT_EQ(wildcard.find(b.g).size(), 2u);
}

TEST(Pattern, InnerNodesReadOutsideTheMatchAreRefusedUnlessAllowed) {
  Builder b({3});
  b.add("a", "Relu", {"x"}, {"r"});
  b.add("b", "Relu", {"r"}, {"s"});
  b.add("c", "Add", {"r", "s"}, {"y"});  // reads the inner Relu's output too
  EXPECT_TRUE(relu_pair().find(b.g).empty());
  EXPECT_EQ(relu_pair().allow_external_uses().find(b.g).size(), 1u);
}

TEST(Pattern, RewriteRepeatsUntilNothingMatches) {
  auto collapse = [](Graph& g, const Match& m) {
    g.replace_all_uses(m.at("a")->outputs[0], m.at("a")->inputs[0]);  // Relu(Relu(x)) = Relu(x)
    return true;
  };
  Builder once = relu_chain(8), fixpoint = relu_chain(8);
  EXPECT_EQ(rewrite(once.g, relu_pair(), collapse, /*repeat=*/false), 4u);
  EXPECT_EQ(once.g.num_nodes(), 4u);
  EXPECT_EQ(rewrite(fixpoint.g, relu_pair(), collapse), 7u);
  ASSERT_EQ(fixpoint.g.num_nodes(), 1u);
  EXPECT_EQ(fixpoint.g.node(0).outputs[0], "y");
  at::Tensor x = at::randn({2, 3});
  EXPECT_TRUE(at::equal(run(fixpoint.g, x), at::relu(x)));
}

TEST(Pattern, BadPatternsAreErrors) {
  Pattern p;
  EXPECT_THROW(p.node("b", {"Relu"}, {"a"}), Error);
  p.node("a", {"Relu"});
  EXPECT_THROW(p.node("a", {"Relu"}), Error);
}

}  // namespace
}  // namespace sparsebit::testing
