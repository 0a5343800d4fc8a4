// The pattern matcher (overlaps, any-order inputs, checks, external uses, repeat) and every
// shipped simplify pass on small graphs: exact resulting structure, and the same outputs as the
// original graph (1e-5 relative) through the executor.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/pattern.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using testing::Builder;

std::vector<std::string> ops(const Graph& g) {
  std::vector<std::string> out;
  for (const Node* n : g.nodes()) out.push_back(n->op_type);
  return out;
}

at::Tensor run(const Graph& g, const at::Tensor& x) {
  Executor ex(g, testing::shipped_registry());
  return ex.run({{"x", x}})[0];
}

/// Runs `pass` on a copy of `g`; checks it changed the graph and kept the outputs.
Graph apply_and_compare(const Graph& g, const std::string& pass, const at::Tensor& x) {
  Graph after = g.clone();
  EXPECT_TRUE(run_simplify_pass(pass, after, testing::shipped_registry())) << pass << " did nothing";
  const at::Tensor want = run(g, x), got = run(after, x);
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * std::max(1.0, want.abs().max().item<double>())) << pass;
  return after;
}

Builder relu_chain(int n) {
  Builder b({2, 3});
  std::string prev = "x";
  for (int i = 0; i < n; ++i) {
    const std::string out = i + 1 == n ? "y" : "r" + std::to_string(i);
    b.add("relu" + std::to_string(i), "Relu", {prev}, {out});
    prev = out;
  }
  return b;
}

Pattern relu_pair() {
  Pattern p;
  p.node("a", {"Relu"});
  p.node("b", {"Relu"}, {"a"});
  return p;
}

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
  only_first.node("a", {"Relu"}, {}, Pattern::Inputs::kOrdered, [](const Node& n, const Graph&) { return n.name != "relu0"; });
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
    b.add("bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"}, {{"epsilon", Attribute::of_float(1e-3)}});
    Graph g = apply_and_compare(b.g, "fuse_bn", at::randn({2, 4, 5, 5}));
    EXPECT_EQ(ops(g), (std::vector<std::string>{"Conv"}));
    EXPECT_EQ(g.node(0).outputs[0], "y");
  }
  {
    Builder b({1, 4, 3, 3});
    b.constant("w", at::randn({4, 3, 2, 2}));  // group 2: 6 output channels
    bn_params(b, 6);
    b.add("deconv", "ConvTranspose", {"x", "w"}, {"c"}, {{"group", Attribute::of_int(2)}, {"strides", Attribute::of_ints({2, 2})}});
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
          {{"transB", Attribute::of_int(trans_b)}, {"alpha", Attribute::of_float(0.5)}, {"beta", Attribute::of_float(2.0)}});
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
  EXPECT_FALSE(run_simplify_pass("fuse_matmul_add", c.g, testing::shipped_registry()));
  EXPECT_EQ(ops(c.g), (std::vector<std::string>{"MatMul", "Add"}));
}

TEST(Passes, FuseHardSwishGeluAndLayerNorm) {
  {
    Builder b({2, 8}, 14);
    b.add("hs", "HardSigmoid", {"x"}, {"h"}, {{"alpha", Attribute::of_float(1.0 / 6)}, {"beta", Attribute::of_float(0.5)}});
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
    EXPECT_FALSE(run_simplify_pass("fuse_gelu", old, testing::shipped_registry()));
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
}  // namespace sparsebit

#include "sparsebit/core/bn_tuning.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {
namespace {

// The first BatchNormalization of the opset-9 fixture has no BN upstream, so its tuned
// statistics must equal the plain mean / biased variance of its input with every quantizer on,
// computed here independently through QuantModel::forward.
TEST(BnTuning, FirstBatchNormGetsTheQuantizedInputStatistics) {
  testing::TempDir work;
  at::manual_seed(0);
  const at::Tensor data = at::randn({24, 3, 16, 16}) * 2 + 0.5;
  write_npy(data, work / "calib.npy");
  Config config = Config::from_string("backend = \"virtual\"\n[schedule]\nbn_tuning = true\n[calibration]\nbatch_size = 8\n", "bn.toml");
  ASSERT_TRUE(bn_tuning_enabled(config));
  Model model = load_onnx(testing::source_path("tests/fixtures/opset9_cnn.onnx"));
  const Node* bn = nullptr;
  for (const Node* n : model.graph.nodes())
    if (n->op_type == "BatchNormalization" && !bn) bn = n;
  ASSERT_NE(bn, nullptr);
  const std::string bn_input = bn->inputs[0], mean_name = bn->inputs[3], var_name = bn->inputs[4];

  Model tuned = tune_batchnorm(model, config, testing::shipped_registry(), work / "calib.npy");

  Config unfused = config;
  for (auto& e : unfused.schedule) e.enabled = e.enabled && e.pass != "fuse_bn";
  QuantModel qm(Model{model.graph.clone(), model.meta}, unfused, testing::shipped_registry());
  auto calib = open_dataset(work / "calib.npy", qm.graph().inputs);
  qm.calibrate(*calib);
  qm.set_quant(true, true);
  at::Tensor seen;
  qm.forward({data}, [&](const std::string& name, const at::Tensor& x) {
    if (name == bn_input && !seen.defined()) seen = x.to(at::kDouble);
  });
  ASSERT_TRUE(seen.defined());
  const at::Tensor mean = seen.mean({0, 2, 3}), var = seen.var({0, 2, 3}, /*unbiased=*/false);
  EXPECT_TRUE(at::allclose(tuned.graph.initializers.at(mean_name).to(at::kDouble), mean, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(tuned.graph.initializers.at(var_name).to(at::kDouble), var, 1e-5, 1e-6));
  EXPECT_FALSE(at::allclose(model.graph.initializers.at(mean_name).to(at::kDouble), mean, 1e-3, 1e-4))
      << "the fixture's own statistics differ, so the test can tell";
  // The tuned model converts as usual: fuse_bn folds the tuned statistics into the conv.
  QuantModel folded(std::move(tuned), config, testing::shipped_registry());
  for (const Node* n : folded.graph().nodes()) EXPECT_NE(n->op_type, "BatchNormalization");
}

}  // namespace
}  // namespace sparsebit

namespace sparsebit {
namespace {

// Conv -> ReLU -> depthwise Conv -> LeakyRelu -> Conv where two output channels of the first
// conv are 50x larger than the rest and the depthwise conv scales them back down (the imbalance
// training leaves and equalization targets): equalization keeps the function and shrinks the
// per-tensor weight-quantization error of the whole model.
TEST(Equalization, KeepsTheFunctionAndHelpsPerTensorWeights) {
  at::manual_seed(3);
  Builder b({2, 3, 8, 8});
  at::Tensor w1 = at::randn({6, 3, 3, 3}) * 0.2;
  w1.narrow(0, 0, 2).mul_(50);
  b.constant("w1", w1);
  b.constant("b1", at::randn({6}));
  at::Tensor w2 = at::randn({6, 1, 3, 3});
  w2.narrow(0, 0, 2).div_(50);
  b.constant("w2", w2);
  b.constant("w3", at::randn({4, 6, 1, 1}));
  b.add("conv1", "Conv", {"x", "w1", "b1"}, {"c1"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  b.add("relu", "Relu", {"c1"}, {"r1"});
  b.add("dw", "Conv", {"r1", "w2"}, {"c2"}, {{"group", Attribute::of_int(6)}});
  b.add("leaky", "LeakyRelu", {"c2"}, {"r2"}, {{"alpha", Attribute::of_float(0.1)}});
  b.add("pw", "Conv", {"r2", "w3"}, {"y"});
  const at::Tensor x = at::randn({2, 3, 8, 8});
  Graph g = apply_and_compare(b.g, "cross_layer_equalization", x);
  EXPECT_EQ(ops(g), ops(b.g));
  auto spread = [](const at::Tensor& w) {
    const at::Tensor r = w.abs().reshape({w.size(0), -1}).amax(1);
    return (r.max() / r.min()).item<double>();
  };
  const Node* conv1 = nullptr;
  for (const Node* n : g.nodes())
    if (n->name == "conv1") conv1 = n;
  EXPECT_LT(spread(g.initializers.at(conv1->inputs[1])), spread(w1) / 5);

  auto weight_quant_error = [&](const Graph& graph) {
    Model m{graph.clone(), ModelMeta{}};
    Config c = Config::from_string("backend = \"virtual\"\n[w]\nqscheme = \"per-tensor-symmetric\"\n[a]\ndisable = true\n", "w.toml");
    QuantModel qm(std::move(m), c, testing::shipped_registry());
    testing::TempDir dir;
    write_npy(x, dir / "x.npy");
    auto data = open_dataset(dir / "x.npy", qm.graph().inputs);
    qm.calibrate(*data);
    const at::Tensor ref = qm.forward({x})[0];
    qm.set_quant(true, false);
    return (qm.forward({x})[0] - ref).pow(2).mean().item<double>();
  };
  const double before = weight_quant_error(b.g), after = weight_quant_error(g);
  std::printf("per-tensor int8 weights, output MSE: %.3g before equalization, %.3g after\n", before, after);
  EXPECT_LT(after, before / 4);
}

}  // namespace
}  // namespace sparsebit
