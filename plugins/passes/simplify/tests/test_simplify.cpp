// The simplify passes on small graphs: exact resulting structure, and the same outputs as the
// original graph (1e-5 relative) through the executor.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Passes, RemoveIdentityKeepsGraphOutputs) {
  Builder b({2, 3});
  b.add("id", "Identity", {"x"}, {"i"});
  b.add("drop", "Dropout", {"i"}, {"d"});
  b.add("relu", "Relu", {"d"}, {"r"});
  b.add("out", "Identity", {"r"}, {"y"});
  Graph g = apply_and_compare(b.g, "remove_identity", at::randn({2, 3}));
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Relu", "Identity"}));
  EXPECT_EQ(g.node(0).inputs[0], "x");
}

TEST(Passes, FoldConstantsFoldsShapeArithmetic) {
  Builder b({2, 12});
  b.constant("w", at::randn({3, 4}));
  b.constant("zero", at::zeros({1}, at::kLong));
  b.constant("minus_one", at::full({1}, -1, at::kLong));
  b.add("shape", "Shape", {"w"}, {"s"});
  b.add("first", "Gather", {"s", "zero"}, {"d0"});
  b.add("cat", "Concat", {"minus_one", "d0"}, {"target"}, {{"axis", Attribute::of_int(0)}});
  b.add("reshape", "Reshape", {"x", "target"}, {"y"});
  Graph g = apply_and_compare(b.g, "fold_constants", at::randn({2, 12}));
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Reshape"}));
  EXPECT_TRUE(at::equal(g.initializers.at(g.node(0).inputs[1]), at::tensor({-1, 3}, at::kLong)));
  EXPECT_FALSE(g.initializers.count("w")) << "initializers nothing reads any more are dropped";
}

TEST(Passes, FoldConstantsFoldsInsideControlFlowBodies) {
  // y = If(c, x @ Unsqueeze(w)[0] ..., x): the weight is computed from an enclosing constant and
  // a body constant, as exporters write recurrent weights inside branches.
  Builder b({2, 4});
  b.constant("w", at::randn({4, 4}));
  b.constant("c", at::ones({}, at::kBool));
  Graph then_branch;
  then_branch.opset_imports = b.g.opset_imports;
  then_branch.outputs.push_back({"yt", 1, false, {}, ""});
  then_branch.initializers["axes"] = at::zeros({1}, at::kLong);
  then_branch.append(make_node("unsq", "Unsqueeze", {"w", "axes"}, {"w3"}));
  then_branch.append(make_node("sq", "Squeeze", {"w3", "axes"}, {"w2"}));
  then_branch.append(make_node("mm", "MatMul", {"x", "w2"}, {"yt"}));
  Graph else_branch;
  else_branch.opset_imports = b.g.opset_imports;
  else_branch.outputs.push_back({"ye", 1, false, {}, ""});
  else_branch.append(make_node("neg", "Neg", {"x"}, {"ye"}));
  b.add("if", "If", {"c"}, {"y"},
        {{"then_branch", Attribute::of_graph(std::move(then_branch))},
         {"else_branch", Attribute::of_graph(std::move(else_branch))}});
  Graph g = apply_and_compare(b.g, "fold_constants", at::randn({2, 4}));
  const Graph& folded = *g.find_node("if")->attributes.at("then_branch").graph;
  EXPECT_EQ(ops(folded), (std::vector<std::string>{"MatMul"}));
  EXPECT_TRUE(at::equal(folded.initializers.at(folded.node(0).inputs[1]), b.g.initializers.at("w")));
  EXPECT_FALSE(folded.initializers.count("axes")) << "a body's initializers nothing reads are dropped";
}

// Two branches that slice the same enclosing weight alike (each with its own starts, ends and
// axes) share one folded copy, held where the weight was (Note [Folding in bodies]): a copy per
// branch would make the export larger than the model.
TEST(Passes, FoldConstantsFoldsWhatBranchesComputeFromOneWeightOnce) {
  Builder b({2, 16});
  b.constant("w", at::randn({16, 32}));
  b.constant("c", at::ones({}, at::kBool));
  auto branch = [&](const std::string& tag, bool negate) {
    Graph body;
    body.opset_imports = b.g.opset_imports;
    body.outputs.push_back({"y" + tag, 1, false, {}, ""});
    body.initializers["starts" + tag] = at::zeros({1}, at::kLong);
    body.initializers["ends" + tag] = at::full({1}, 16, at::kLong);
    body.initializers["axes" + tag] = at::ones({1}, at::kLong);
    body.append(make_node("slice" + tag, "Slice", {"w", "starts" + tag, "ends" + tag, "axes" + tag}, {"w" + tag}));
    body.append(make_node("mm" + tag, "MatMul", {"x", "w" + tag}, {negate ? "m" + tag : "y" + tag}));
    if (negate) body.append(make_node("neg" + tag, "Neg", {"m" + tag}, {"y" + tag}));
    return body;
  };
  b.add("if", "If", {"c"}, {"y"},
        {{"then_branch", Attribute::of_graph(branch("t", false))},
         {"else_branch", Attribute::of_graph(branch("e", true))}});
  Graph g = apply_and_compare(b.g, "fold_constants", at::randn({2, 16}));
  const Node& n = *g.find_node("if");
  const Graph &then_branch = *n.attributes.at("then_branch").graph,
              &else_branch = *n.attributes.at("else_branch").graph;
  ASSERT_EQ(ops(then_branch), (std::vector<std::string>{"MatMul"}));
  ASSERT_EQ(ops(else_branch), (std::vector<std::string>{"MatMul", "Neg"}));
  const std::string sliced = then_branch.node(0).inputs[1];
  EXPECT_EQ(else_branch.node(0).inputs[1], sliced) << "one folded copy for both branches";
  ASSERT_TRUE(g.initializers.count(sliced)) << "held by the graph that holds the weight";
  EXPECT_TRUE(at::equal(g.initializers.at(sliced), b.g.initializers.at("w").narrow(1, 0, 16)));
  EXPECT_TRUE(then_branch.initializers.empty() && else_branch.initializers.empty());
  EXPECT_FALSE(g.initializers.count("w"));
}

TEST(Passes, FuseBatchNormIntoConvConvTransposeAndGemm) {
  auto bn_params = [](Builder& b, std::int64_t c) {
    b.constant("gamma", at::rand({c}) + 0.5);
    b.constant("beta", at::randn({c}));
    b.constant("mean", at::randn({c}));
    b.constant("var", at::rand({c}) + 0.5);
  };
  {
    Builder b({2, 4, 5, 5});
    b.constant("w", at::randn({6, 2, 3, 3}));
    b.constant("bias", at::randn({6}));
    bn_params(b, 6);
    b.add("conv", "Conv", {"x", "w", "bias"}, {"c"}, {{"group", Attribute::of_int(2)}});
    b.add("bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"},
          {{"epsilon", Attribute::of_float(1e-3)}});
    Graph g = apply_and_compare(b.g, "fuse_bn", at::randn({2, 4, 5, 5}));
    EXPECT_EQ(ops(g), (std::vector<std::string>{"Conv"}));
    EXPECT_EQ(g.node(0).outputs[0], "y");
  }
  {
    Builder b({1, 4, 3, 3});
    b.constant("w", at::randn({4, 3, 2, 2}));  // group 2: 6 output channels
    bn_params(b, 6);
    b.add("deconv", "ConvTranspose", {"x", "w"}, {"c"},
          {{"group", Attribute::of_int(2)}, {"strides", Attribute::of_ints({2, 2})}});
    b.add("bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_bn", at::randn({1, 4, 3, 3}));
    EXPECT_EQ(ops(g), (std::vector<std::string>{"ConvTranspose"}));
  }
  for (bool trans_b : {false, true}) {
    Builder b({3, 5});
    b.constant("w", trans_b ? at::randn({4, 5}) : at::randn({5, 4}));
    b.constant("bias", at::randn({4}));
    bn_params(b, 4);
    b.add("fc", "Gemm", {"x", "w", "bias"}, {"f"},
          {{"transB", Attribute::of_int(trans_b)},
           {"alpha", Attribute::of_float(0.5)},
           {"beta", Attribute::of_float(2.0)}});
    b.add("bn", "BatchNormalization", {"f", "gamma", "beta", "mean", "var"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_bn", at::randn({3, 5}));
    EXPECT_EQ(ops(g), (std::vector<std::string>{"Gemm"}));
  }
}

TEST(Passes, FuseMatMulAddNeedsATwoDimensionalInput) {
  Builder b({2, 3, 4});
  b.constant("w", at::randn({12, 5}));
  b.constant("bias", at::randn({5}));
  b.add("flat", "Flatten", {"x"}, {"f"});
  b.add("mm", "MatMul", {"f", "w"}, {"m"});
  b.add("add", "Add", {"bias", "m"}, {"y"});
  Graph g = apply_and_compare(b.g, "fuse_matmul_add", at::randn({2, 3, 4}));
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Flatten", "Gemm"}));
  // A 3-D activation stays MatMul + Add.
  Builder c({2, 3, 12});
  c.constant("w", at::randn({12, 5}));
  c.constant("bias", at::randn({5}));
  c.add("mm", "MatMul", {"x", "w"}, {"m"});
  c.add("add", "Add", {"m", "bias"}, {"y"});
  EXPECT_FALSE(run_simplify_pass("fuse_matmul_add", c.g, shipped_registry()));
  EXPECT_EQ(ops(c.g), (std::vector<std::string>{"MatMul", "Add"}));
}

// TensorFlow exporters write activations as arithmetic after the convolution: LeakyRelu as
// Max(x, a * x), ReLU6 as Max(x, 0) -> Min(x, 6) or Relu -> Min.
TEST(Passes, FuseActivationsTurnsTensorFlowArithmeticIntoActivationOps) {
  auto conv_block = [](std::int64_t opset) {
    Builder b({1, 3, 8, 8}, opset);
    b.constant("w", at::randn({4, 3, 3, 3}));
    b.add("conv", "Conv", {"x", "w"}, {"c"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
    return b;
  };
  const at::Tensor x = at::randn({1, 3, 8, 8}) * 3;
  {
    Builder b = conv_block(13);
    b.constant("alpha", at::full({}, 0.2, at::kFloat));
    b.add("mul", "Mul", {"alpha", "c"}, {"m"});
    b.add("max", "Max", {"m", "c"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_activations", x);
    EXPECT_EQ(ops(g), (std::vector<std::string>{"Conv", "LeakyRelu"}));
    EXPECT_NEAR(g.find_node("max")->attr_float("alpha", 0), 0.2, 1e-7);
  }
  for (std::int64_t opset : {9, 13}) {  // Clip's bounds are attributes before opset 11, inputs after
    Builder b = conv_block(opset);
    b.constant("zero", at::zeros({1}, at::kFloat));  // rank 1: broadcasts over the Conv's 4-D output
    b.constant("six", at::full({}, 6.0, at::kFloat));
    b.add("max", "Max", {"c", "zero"}, {"r"});
    b.add("min", "Min", {"six", "r"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_activations", x);
    ASSERT_EQ(ops(g), (std::vector<std::string>{"Conv", "Clip"})) << "opset " << opset;
    const Node& clip = *g.find_node("min");
    if (opset < 11) {
      EXPECT_EQ(clip.attr_float("min", -1), 0.0);
      EXPECT_EQ(clip.attr_float("max", -1), 6.0);
    } else {
      ASSERT_EQ(clip.inputs.size(), 3u);
      EXPECT_EQ(g.initializers.at(clip.inputs[1]).item<double>(), 0.0);
      EXPECT_EQ(g.initializers.at(clip.inputs[2]).item<double>(), 6.0);
    }
  }
  {  // Max(x, 0.5): a lower bound only
    Builder b = conv_block(13);
    b.constant("half", at::full({}, 0.5, at::kFloat));
    b.add("max", "Max", {"half", "c"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_activations", x);
    EXPECT_EQ(ops(g), (std::vector<std::string>{"Conv", "Clip"}));
  }
}

// TensorFlow's SAME padding with stride 2 pads unevenly: tf2onnx writes a Pad before the Conv.
TEST(Passes, FusePadMovesZeroSpatialPaddingIntoTheConv) {
  const at::Tensor x = at::randn({1, 3, 9, 9});
  for (std::int64_t opset : {9, 13}) {  // pads as an attribute before opset 11, as an input after
    Builder b({1, 3, 9, 9}, opset);
    b.constant("w", at::randn({4, 3, 3, 3}));
    const std::vector<std::int64_t> pads{0, 0, 0, 1, 0, 0, 2, 1};
    if (opset < 11) {
      b.add("pad", "Pad", {"x"}, {"p"}, {{"pads", Attribute::of_ints(pads)}});
    } else {
      b.constant("pads", at::tensor(pads, at::kLong));
      b.constant("value", at::zeros({}, at::kFloat));
      b.add("pad", "Pad", {"x", "pads", "value"}, {"p"});
    }
    b.add("conv", "Conv", {"p", "w"}, {"y"},
          {{"strides", Attribute::of_ints({2, 2})}, {"pads", Attribute::of_ints({1, 0, 0, 0})}});
    Graph g = apply_and_compare(b.g, "fuse_pad", x);
    ASSERT_EQ(ops(g), (std::vector<std::string>{"Conv"})) << "opset " << opset;
    EXPECT_EQ(g.find_node("conv")->attr_ints("pads"), (std::vector<std::int64_t>{1, 1, 2, 1}));
  }
  auto unchanged = [&](const std::string& mode, const std::vector<std::int64_t>& pads, double value) {
    Builder b({1, 3, 9, 9}, 13);
    b.constant("w", at::randn({4, 3, 3, 3}));
    b.constant("pads", at::tensor(pads, at::kLong));
    b.constant("value", at::full({}, value, at::kFloat));
    b.add("pad", "Pad", {"x", "pads", "value"}, {"p"}, {{"mode", Attribute::of_string(mode)}});
    b.add("conv", "Conv", {"p", "w"}, {"y"});
    Graph g = b.g.clone();
    EXPECT_FALSE(run_simplify_pass("fuse_pad", g, shipped_registry())) << mode;
  };
  unchanged("reflect", {0, 0, 1, 1, 0, 0, 1, 1}, 0);
  unchanged("constant", {0, 0, 1, 1, 0, 0, 1, 1}, 1.5);  // not zeros
  unchanged("constant", {0, 1, 1, 1, 0, 0, 1, 1}, 0);    // pads channels
  unchanged("constant", {0, 0, -1, 1, 0, 0, 1, 1}, 0);   // crops
}

// tf2onnx's layout: NHWC in, each Conv between Transposes to NCHW and back, the activation in
// NHWC between them. With the activation moved before the Transpose the inner pairs cancel.
TEST(Passes, MoveTransposesLetsTheTransposesAroundConvolutionsCancel) {
  Builder b({1, 8, 8, 3});
  b.constant("w1", at::randn({4, 3, 3, 3}));
  b.constant("w2", at::randn({5, 4, 3, 3}));
  b.constant("lo", at::zeros({}));
  b.constant("hi", at::full({}, 6.0));
  const auto to_nchw = Attribute::of_ints({0, 3, 1, 2}), to_nhwc = Attribute::of_ints({0, 2, 3, 1});
  const auto same = Attribute::of_ints({1, 1, 1, 1});
  b.add("in", "Transpose", {"x"}, {"a"}, {{"perm", to_nchw}});
  b.add("conv1", "Conv", {"a", "w1"}, {"c1"}, {{"pads", same}});
  b.add("back1", "Transpose", {"c1"}, {"h1"}, {{"perm", to_nhwc}});
  b.add("act1", "LeakyRelu", {"h1"}, {"l1"}, {{"alpha", Attribute::of_float(0.2)}});
  b.add("act2", "Clip", {"l1", "lo", "hi"}, {"r1"});
  b.add("there", "Transpose", {"r1"}, {"b"}, {{"perm", to_nchw}});
  b.add("conv2", "Conv", {"b", "w2"}, {"c2"}, {{"pads", same}});
  b.add("back2", "Transpose", {"c2"}, {"y"}, {{"perm", to_nhwc}});
  const at::Tensor x = at::randn({1, 8, 8, 3});
  Graph g = apply_and_compare(b.g, "move_transposes", x);
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Transpose", "Conv", "LeakyRelu", "Clip", "Transpose", "Transpose",
                                              "Conv", "Transpose"}));
  // A Relu that a Transpose kept apart from a Clip merges with it once they meet.
  {
    Builder r({1, 4, 5, 5});
    r.constant("lo", at::full({}, 1.0));
    r.constant("hi", at::full({}, 6.0));
    r.add("relu", "Relu", {"x"}, {"a"});
    r.add("t", "Transpose", {"a"}, {"b"}, {{"perm", to_nhwc}});
    r.add("clip", "Clip", {"b", "lo", "hi"}, {"y"});
    Graph moved = apply_and_compare(r.g, "move_transposes", at::randn({1, 4, 5, 5}) * 5);
    EXPECT_EQ(ops(moved), (std::vector<std::string>{"Clip", "Transpose"}));
  }
  Graph merged = apply_and_compare(g, "merge_transposes", x);
  EXPECT_EQ(ops(merged), (std::vector<std::string>{"Transpose", "Conv", "LeakyRelu", "Clip", "Conv", "Transpose"}));
}

TEST(Passes, FuseActivationsLeavesWhatIsNotAnActivation) {
  auto unchanged = [](const Builder& b) {
    Graph g = b.g.clone();
    EXPECT_FALSE(run_simplify_pass("fuse_activations", g, shipped_registry()));
    EXPECT_EQ(ops(g), ops(b.g));
  };
  {  // a >= 1: max(x, 1.5 x) is not LeakyRelu
    Builder b({2, 8});
    b.constant("a", at::full({}, 1.5, at::kFloat));
    b.add("mul", "Mul", {"x", "a"}, {"m"});
    b.add("max", "Max", {"x", "m"}, {"y"});
    unchanged(b);
  }
  {  // a per-channel bound is not a Clip
    Builder b({2, 8});
    b.constant("c", at::randn({8}));
    b.add("max", "Max", {"x", "c"}, {"y"});
    unchanged(b);
  }
  {  // a rank-1 bound on a value of unknown rank could change the output's shape
    Builder b({2, 8});
    b.constant("c", at::zeros({1}));
    b.add("neg", "Neg", {"x"}, {"n"});
    b.add("max", "Max", {"n", "c"}, {"y"});
    unchanged(b);
  }
  {  // the scaled value is read elsewhere too
    Builder b({2, 8});
    b.constant("a", at::full({}, 0.1, at::kFloat));
    b.add("mul", "Mul", {"x", "a"}, {"m"});
    b.add("max", "Max", {"x", "m"}, {"t"});
    b.add("add", "Add", {"t", "m"}, {"y"});
    unchanged(b);
  }
}

TEST(Passes, FuseHardSwishGeluAndLayerNorm) {
  {
    Builder b({2, 8}, 14);
    b.add("hs", "HardSigmoid", {"x"}, {"h"},
          {{"alpha", Attribute::of_float(1.0 / 6)}, {"beta", Attribute::of_float(0.5)}});
    b.add("mul", "Mul", {"x", "h"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_hardswish", at::randn({2, 8}) * 4);
    EXPECT_EQ(ops(g), (std::vector<std::string>{"HardSwish"}));
  }
  {
    Builder b({2, 8}, 20);
    b.constant("sqrt2", at::full({}, std::sqrt(2.0), at::kFloat));
    b.constant("one", at::full({}, 1.0, at::kFloat));
    b.constant("half", at::full({}, 0.5, at::kFloat));
    b.add("div", "Div", {"x", "sqrt2"}, {"d"});
    b.add("erf", "Erf", {"d"}, {"e"});
    b.add("add", "Add", {"e", "one"}, {"a"});
    b.add("mul", "Mul", {"x", "a"}, {"m"});
    b.add("half_mul", "Mul", {"m", "half"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_gelu", at::randn({2, 8}) * 3);
    EXPECT_EQ(ops(g), (std::vector<std::string>{"Gelu"}));
    Graph old = b.g.clone();  // an opset without Gelu keeps the pattern
    old.opset_imports[""] = 17;
    EXPECT_FALSE(run_simplify_pass("fuse_gelu", old, shipped_registry()));
  }
  {
    Builder b({2, 3, 8}, 17);
    b.constant("axes", at::full({1}, -1, at::kLong));
    b.constant("two", at::full({}, 2.0, at::kFloat));
    b.constant("eps", at::full({}, 1e-5, at::kFloat));
    b.constant("gamma", at::rand({8}) + 0.5);
    b.constant("beta", at::randn({8}));
    b.add("mean", "ReduceMean", {"x"}, {"mu"}, {{"axes", Attribute::of_ints({-1})}});
    b.add("sub", "Sub", {"x", "mu"}, {"d"});
    b.add("pow", "Pow", {"d", "two"}, {"p"});
    b.add("var", "ReduceMean", {"p"}, {"v"}, {{"axes", Attribute::of_ints({-1})}});
    b.add("add_eps", "Add", {"v", "eps"}, {"ve"});
    b.add("sqrt", "Sqrt", {"ve"}, {"s"});
    b.add("div", "Div", {"d", "s"}, {"n"});
    b.add("scale", "Mul", {"n", "gamma"}, {"sc"});
    b.add("shift", "Add", {"sc", "beta"}, {"y"});
    Graph g = apply_and_compare(b.g, "fuse_layernorm", at::randn({2, 3, 8}) * 2 + 1);
    EXPECT_EQ(ops(g), (std::vector<std::string>{"LayerNormalization"}));
    EXPECT_EQ(g.node(0).attr_int("axis", 0), -1);
  }
}

}  // namespace
}  // namespace sparsebit::testing
