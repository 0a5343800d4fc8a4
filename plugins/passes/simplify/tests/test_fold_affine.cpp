// fuse_affine and fuse_hardsigmoid: what they fold, checked through the executor (the outputs
// before and after agree), and what they must leave (padding, a constant that broadcasts across
// channels, a second reader).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Passes, FuseAffineFoldsPerChannelAndScalarMapsIntoTheLayerBefore) {
  Builder b({2, 4, 6, 6});
  b.constant("w", at::randn({8, 2, 3, 3}));
  b.constant("bias", at::randn({8}));
  b.constant("scale", at::rand({1, 8, 1, 1}) + 0.5);  // per channel, as BN-free exporters write it
  b.constant("shift", at::full({}, 0.25f));
  b.constant("div", at::full({1}, 4.0f));
  b.add("conv", "Conv", {"x", "w", "bias"}, {"c"}, {{"group", Attribute::of_int(2)}});
  b.add("mul", "Mul", {"scale", "c"}, {"m"});  // the constant first
  b.add("add", "Add", {"m", "shift"}, {"a"});
  b.add("div", "Div", {"a", "div"}, {"y"});
  Graph g = apply_and_compare(b.g, "fuse_affine", at::randn({2, 4, 6, 6}));
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Conv"}));
  EXPECT_EQ(g.node(0).outputs[0], "y");
}

TEST(Passes, FuseAffineFoldsAScalarMapIntoAnUnpaddedLayerAfter) {
  for (const std::string layer : {"Conv", "Gemm"}) {
    const bool conv = layer == "Conv";
    Builder b(conv ? std::vector<std::int64_t>{2, 4, 5, 5} : std::vector<std::int64_t>{3, 4});
    b.constant("a", at::full({}, 1.7f));
    b.constant("b", at::full({}, -0.3f));
    b.constant("w", conv ? at::randn({6, 4, 1, 1}) : at::randn({6, 4}));
    b.constant("bias", at::randn({6}));
    b.add("mul", "Mul", {"x", "a"}, {"m"});
    b.add("sub", "Sub", {"m", "b"}, {"s"});
    if (conv) b.add("conv", "Conv", {"s", "w", "bias"}, {"y"});
    else
      b.add("fc", "Gemm", {"s", "w", "bias"}, {"y"},
            {{"transB", Attribute::of_int(1)}, {"alpha", Attribute::of_float(0.5)}});
    Graph g = apply_and_compare(b.g, "fuse_affine", conv ? at::randn({2, 4, 5, 5}) : at::randn({3, 4}));
    EXPECT_EQ(ops(g), (std::vector<std::string>{layer})) << layer;
  }
}

TEST(Passes, FuseAffineLeavesPaddingBroadcastsAndSharedOutputs) {
  {  // x + b before a padded conv: the padding's zeros would become b
    Builder b({1, 2, 5, 5});
    b.constant("b", at::full({}, 0.5f));
    b.constant("w", at::randn({3, 2, 3, 3}));
    b.add("add", "Add", {"x", "b"}, {"a"});
    b.add("conv", "Conv", {"a", "w"}, {"y"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
    Graph g = b.g.clone();
    EXPECT_FALSE(run_simplify_pass("fuse_affine", g, shipped_registry()));
  }
  {  // a constant along the spatial axes is no per-channel map; c - conv is no affine map of conv
    Builder b({1, 2, 4, 4});
    b.constant("w", at::randn({3, 2, 1, 1}));
    b.constant("spatial", at::rand({1, 1, 4, 4}));
    b.constant("c", at::full({}, 2.0f));
    b.add("conv", "Conv", {"x", "w"}, {"h"});
    b.add("mul", "Mul", {"h", "spatial"}, {"m"});
    b.add("conv2", "Conv", {"m", "w2"}, {"h2"});
    b.constant("w2", at::randn({3, 3, 1, 1}));
    b.add("sub", "Sub", {"c", "h2"}, {"y"});
    Graph g = b.g.clone();
    EXPECT_FALSE(run_simplify_pass("fuse_affine", g, shipped_registry()));
  }
  {  // the conv's output has a second reader: folding would change what it reads
    Builder b({1, 2, 4, 4});
    b.constant("w", at::randn({3, 2, 1, 1}));
    b.constant("s", at::full({}, 3.0f));
    b.add("conv", "Conv", {"x", "w"}, {"h"});
    b.add("mul", "Mul", {"h", "s"}, {"m"});
    b.add("add", "Add", {"h", "m"}, {"y"});
    Graph g = b.g.clone();
    EXPECT_FALSE(run_simplify_pass("fuse_affine", g, shipped_registry()));
  }
}

TEST(Passes, FuseHardSigmoidTakesHardSwishAndHardSigmoidWrittenAsArithmetic) {
  auto written_out = [](bool swish, bool divide, std::int64_t opset) {
    Builder b({2, 16}, opset);
    b.constant("three", at::full({}, 3.0f));
    b.constant("zero", at::full({}, 0.0f));
    b.constant("six", at::full({}, 6.0f));
    b.constant("sixth", at::full({}, 1.0f / 6));
    b.add("add", "Add", {"x", "three"}, {"a"});
    b.add("clip", "Clip", {"a", "zero", "six"}, {"c"});
    const std::string last = divide ? "Div" : "Mul", by = divide ? "six" : "sixth";
    if (swish) {
      b.add("mul", "Mul", {"c", "x"}, {"m"});
      b.add("div", last, {"m", by}, {"y"});
    } else {
      b.add("div", last, {"c", by}, {"y"});
    }
    return b;
  };
  const at::Tensor x = at::randn({2, 16}) * 5;  // both clip edges are crossed
  EXPECT_EQ(ops(apply_and_compare(written_out(true, true, 13).g, "fuse_hardsigmoid", x)),
            (std::vector<std::string>{"HardSigmoid", "Mul"}));
  EXPECT_EQ(ops(apply_and_compare(written_out(false, false, 13).g, "fuse_hardsigmoid", x)),
            (std::vector<std::string>{"HardSigmoid"}));
  // From opset 14 fuse_hardswish then makes one HardSwish of x * HardSigmoid(x).
  Graph g = apply_and_compare(written_out(true, false, 14).g, "fuse_hardsigmoid", x);
  g = apply_and_compare(g, "fuse_hardswish", x);
  EXPECT_EQ(ops(g), (std::vector<std::string>{"HardSwish"}));
}

}  // namespace
}  // namespace sparsebit::testing
