// Opset lifting rules (Note [Opset lifting]): every rewritten op computes on data what the
// original computed, run by our executor in the original opset's semantics (each QModule
// implements the old forms, and those are checked against ONNX's backend test data).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

const OpTraitTable& rules() {
  static const OpTraitTable shipped(testing::shipped_registry());
  return shipped;
}

struct Case {
  Graph g;
  std::vector<at::Tensor> sample;
};

Node make(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
          std::map<std::string, Attribute> attrs = {}) {
  return testing::make_node(op + "_node", op, std::move(in), std::move(out), std::move(attrs));
}

/// A graph of `nodes` over graph input "x" (undeclared shape unless `declare`) at `opset`.
Case single(std::int64_t opset, std::vector<Node> nodes, at::Tensor x, std::vector<std::string> outputs,
            std::map<std::string, at::Tensor> inits = {}, bool declare = false) {
  Case c;
  c.g.opset_imports[""] = opset;
  ValueInfo in;
  in.name = "x";
  in.elem_type = onnx_type_of(x.scalar_type());
  if (declare) {
    in.has_shape = true;
    for (auto d : x.sizes()) in.shape.push_back(Dim{d, ""});
  }
  c.g.inputs.push_back(in);
  for (auto& o : outputs) c.g.outputs.push_back(ValueInfo{o, 0, false, {}, ""});
  c.g.initializers = std::move(inits);
  for (auto& n : nodes) c.g.append(std::move(n));
  c.sample = {x};
  return c;
}

std::vector<at::Tensor> run(const Graph& g, const std::vector<at::Tensor>& sample) {
  Executor ex(g, testing::shipped_registry());
  return ex.run({{"x", sample.at(0)}});
}

/// Lifts with static facts and with facts observed on the sample; both must compute what the
/// original did. Returns the lift with observed facts.
Graph lift_both_ways(const Case& c, std::int64_t target) {
  const auto expected = run(c.g, c.sample);
  Graph observed = c.g.clone();
  lift_opset(observed, target, rules(), observed_value_facts(c.g, testing::shipped_registry(), c.sample));
  Graph fixed = c.g.clone();
  lift_opset(fixed, target, rules(), static_value_facts(c.g));
  for (const Graph* g : {&observed, &fixed}) {
    EXPECT_EQ(g->default_opset(), target);
    const auto got = run(*g, c.sample);
    EXPECT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].sizes(), expected[i].sizes()) << "output " << i;
      if (got[i].sizes() != expected[i].sizes()) continue;
      EXPECT_TRUE(at::allclose(got[i].to(at::kDouble), expected[i].to(at::kDouble), 1e-6, 1e-6))
          << "output " << i << ": max diff "
          << (got[i].to(at::kDouble) - expected[i].to(at::kDouble)).abs().max().item<double>();
    }
  }
  return observed;
}

int count(const Graph& g, const std::string& op) {
  int k = 0;
  for (const Node* n : g.nodes()) k += n->op_type == op;
  return k;
}

TEST(OpsetLift, SoftmaxOnTheLastAxisStaysOneNode) {
  at::manual_seed(0);
  auto c = single(9, {make("Softmax", {"x"}, {"y"}, {{"axis", Attribute::of_int(3)}})}, at::randn({2, 3, 4, 5}), {"y"});
  Graph lifted = lift_both_ways(c, 13);
  EXPECT_EQ(lifted.num_nodes(), 1u);
  EXPECT_EQ(lifted.node(0).attr_int("axis", 0), -1);
  // The default axis (1) of a 2-D input is its last one too.
  auto head = single(11, {make("LogSoftmax", {"x"}, {"y"})}, at::randn({4, 10}), {"y"}, {}, true);
  Graph g = head.g.clone();
  lift_opset(g, 13, rules(), static_value_facts(head.g));  // the declared shape is enough
  EXPECT_EQ(g.num_nodes(), 1u);
}

TEST(OpsetLift, SoftmaxOnAnotherAxisKeepsTheOldFlatteningMeaning) {
  at::manual_seed(1);
  for (std::int64_t axis : {0, 1, 2, -2}) {
    auto c = single(11, {make("Softmax", {"x"}, {"y"}, {{"axis", Attribute::of_int(axis)}})}, at::randn({2, 3, 4, 5}),
                    {"y"});
    Graph lifted = lift_both_ways(c, 13);
    EXPECT_EQ(count(lifted, "Flatten"), 1) << axis;
    EXPECT_EQ(count(lifted, "Reshape"), 1) << axis;
  }
  // Unknown rank (nothing declared, nothing observed): the rewrite is correct for any rank.
  auto c = single(9, {make("LogSoftmax", {"x"}, {"y"})}, at::randn({2, 3, 4}), {"y"});
  Graph g = c.g.clone();
  lift_opset(g, 13, rules(), {});
  EXPECT_TRUE(at::allclose(run(g, c.sample)[0], run(c.g, c.sample)[0], 1e-6, 1e-6));
}

TEST(OpsetLift, ClipAndPadAttributesBecomeInputsOfTheDataType) {
  auto x = at::linspace(-8, 8, 24, at::kDouble).reshape({2, 3, 4});
  auto c =
      single(9, {make("Clip", {"x"}, {"y"}, {{"min", Attribute::of_float(-1.5)}, {"max", Attribute::of_float(2.25)}})},
             x, {"y"});
  Graph lifted = lift_both_ways(c, 13);
  EXPECT_EQ(lifted.initializers.at(lifted.node(0).inputs[1]).scalar_type(), at::kDouble);
  auto only_min = single(10, {make("Clip", {"x"}, {"y"}, {{"min", Attribute::of_float(0)}})}, x.to(at::kFloat), {"y"});
  lift_both_ways(only_min, 13);
  for (const char* mode : {"constant", "reflect", "edge"}) {
    auto pad = single(9,
                      {make("Pad", {"x"}, {"y"},
                            {{"pads", Attribute::of_ints({0, 1, 2, 0, 2, 1})},
                             {"mode", Attribute::of_string(mode)},
                             {"value", Attribute::of_float(0.5)}})},
                      x.to(at::kFloat), {"y"});
    Graph g = lift_both_ways(pad, 13);
    EXPECT_FALSE(g.node(0).has_attr("pads")) << mode;
  }
}

TEST(OpsetLift, SliceTopKSplitSqueezeUnsqueezeAndReduceSumTakeInputs) {
  at::manual_seed(2);
  auto x = at::randn({4, 6, 5});
  lift_both_ways(single(9,
                        {make("Slice", {"x"}, {"y"},
                              {{"starts", Attribute::of_ints({1, -4})},
                               {"ends", Attribute::of_ints({INT64_MAX, -1})},
                               {"axes", Attribute::of_ints({0, 2})}})},
                        x, {"y"}),
                 13);
  lift_both_ways(
      single(9, {make("TopK", {"x"}, {"v", "i"}, {{"k", Attribute::of_int(2)}, {"axis", Attribute::of_int(1)}})}, x,
             {"v", "i"}),
      13);
  lift_both_ways(single(11,
                        {make("Split", {"x"}, {"a", "b"},
                              {{"axis", Attribute::of_int(1)}, {"split", Attribute::of_ints({2, 4})}})},
                        x, {"a", "b"}),
                 13);
  // An equal split needs num_outputs from opset 18 on.
  Graph equal = lift_both_ways(
      single(9, {make("Split", {"x"}, {"a", "b", "c"}, {{"axis", Attribute::of_int(1)}})}, x, {"a", "b", "c"}), 18);
  EXPECT_EQ(equal.node(0).attr_int("num_outputs", 0), 3);
  lift_both_ways(single(9,
                        {make("Unsqueeze", {"x"}, {"u"}, {{"axes", Attribute::of_ints({0, 3})}}),
                         make("Squeeze", {"u"}, {"y"}, {{"axes", Attribute::of_ints({0})}})},
                        x, {"y"}),
                 13);
  lift_both_ways(
      single(12,
             {make("ReduceSum", {"x"}, {"y"}, {{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(0)}})},
             x, {"y"}),
      13);
  // The other reductions keep the attribute until opset 18.
  Graph mean =
      lift_both_ways(single(9, {make("ReduceMean", {"x"}, {"y"}, {{"axes", Attribute::of_ints({-1})}})}, x, {"y"}), 21);
  EXPECT_TRUE(mean.node(0).has_input(1));
  Graph at13 = single(9, {make("ReduceMean", {"x"}, {"y"}, {{"axes", Attribute::of_ints({-1})}})}, x, {"y"}).g;
  lift_opset(at13, 13, rules());
  EXPECT_TRUE(at13.node(0).has_attr("axes"));
}

TEST(OpsetLift, UpsampleAndResize10BecomeResizeWithAsymmetricCoordinates) {
  auto x = at::arange(2 * 3 * 4 * 5, at::kFloat).reshape({2, 3, 4, 5});
  Graph up7 = lift_both_ways(
      single(7, {make("Upsample", {"x"}, {"y"}, {{"scales", Attribute::of_floats({1, 1, 2, 3})}})}, x, {"y"}), 13);
  EXPECT_EQ(up7.node(0).op_type, "Resize");
  EXPECT_EQ(up7.node(0).attr_string("coordinate_transformation_mode", ""), "asymmetric");
  const std::map<std::string, at::Tensor> scales = {{"s", at::tensor({1.f, 1.f, 2.f, 1.5f})}};
  for (const char* mode : {"nearest", "linear"}) {
    lift_both_ways(
        single(9, {make("Upsample", {"x", "s"}, {"y"}, {{"mode", Attribute::of_string(mode)}})}, x, {"y"}, scales), 13);
    lift_both_ways(
        single(10, {make("Resize", {"x", "s"}, {"y"}, {{"mode", Attribute::of_string(mode)}})}, x, {"y"}, scales), 13);
  }
}

TEST(OpsetLift, ScatterDropoutAndGroupNormalization) {
  at::manual_seed(3);
  auto x = at::randn({3, 4});
  const std::map<std::string, at::Tensor> scatter = {
      {"i", at::tensor(std::vector<std::int64_t>{1, 0, 2, 3, 0, 1}, at::kLong).reshape({3, 2})},
      {"u", at::randn({3, 2})}};
  Graph s = lift_both_ways(
      single(9, {make("Scatter", {"x", "i", "u"}, {"y"}, {{"axis", Attribute::of_int(1)}})}, x, {"y"}, scatter), 13);
  EXPECT_EQ(s.node(0).op_type, "ScatterElements");
  Graph d = lift_both_ways(
      single(7, {make("Dropout", {"x"}, {"y", "mask"}, {{"ratio", Attribute::of_float(0.3)}})}, x, {"y"}), 13);
  EXPECT_EQ(d.node(0).outputs.size(), 1u);
  EXPECT_FALSE(d.node(0).has_attr("ratio"));

  auto img = at::randn({2, 6, 3, 3});
  const std::map<std::string, at::Tensor> gn = {{"scale", at::randn({3})}, {"bias", at::randn({3})}};
  Graph g = lift_both_ways(
      single(18, {make("GroupNormalization", {"x", "scale", "bias"}, {"y"}, {{"num_groups", Attribute::of_int(3)}})},
             img, {"y"}, gn, true),
      21);
  EXPECT_EQ(g.initializers.at(g.node(0).inputs[1]).numel(), 6);
}

// Scan-8 over a batch of two, the sequence scanned in reverse: a running sum per batch entry
// (state) and its values per step (scan output). Run as Scan-8 and lifted to a Loop over the
// batch around a Scan-9, both against the sums computed by hand.
TEST(OpsetLift, Scan8BecomesALoopOverTheBatchOfAScan9) {
  Graph body;
  body.inputs = {{"acc", 1, false, {}, ""}, {"step", 1, false, {}, ""}};
  body.outputs = {{"acc_next", 1, false, {}, ""}, {"seen", 1, false, {}, ""}};
  body.append(testing::make_node("add", "Add", {"acc", "step"}, {"acc_next"}));
  body.append(testing::make_node("copy", "Identity", {"acc_next"}, {"seen"}));
  Graph g;
  g.opset_imports[""] = 8;
  g.inputs = {{"init", 1, true, {{2, ""}, {3, ""}}, ""}, {"x", 1, true, {{2, ""}, {4, ""}, {3, ""}}, ""}};
  g.outputs = {{"total", 1, false, {}, ""}, {"partial", 1, false, {}, ""}};
  Node scan = testing::make_node("scan", "Scan", {"", "init", "x"}, {"total", "partial"});
  scan.attributes["num_scan_inputs"] = Attribute::of_int(1);
  scan.attributes["directions"] = Attribute::of_ints({1});
  scan.attributes["body"] = Attribute::of_graph(std::move(body));
  g.append(std::move(scan));
  const at::Tensor init = at::randn({2, 3}), x = at::randn({2, 4, 3});
  const at::Tensor partial = init.unsqueeze(1) + x.flip(1).cumsum(1);  // steps t = 3, 2, 1, 0
  auto check = [&](const Graph& graph, const char* what) {
    Executor ex(graph, testing::shipped_registry());
    auto out = ex.run({{"init", init}, {"x", x}});
    EXPECT_TRUE(at::allclose(out[0], partial.select(1, 3), 1e-5, 1e-6)) << what;
    EXPECT_TRUE(at::allclose(out[1], partial, 1e-5, 1e-6)) << what;
  };
  check(g, "Scan-8");
  Graph lifted = g.clone();
  lift_opset(lifted, 13, rules());
  std::vector<std::string> ops;
  for (const Node* n : lifted.nodes()) ops.push_back(n->op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Shape", "Gather", "Loop"}));
  check(lifted, "lifted to 13");
}

TEST(OpsetLift, WhatCannotBeLiftedIsRefusedNamingNodeAndOpAndTheGraphIsUnchanged) {
  auto x = at::randn({2, 3});
  Graph mask = single(9, {make("Dropout", {"x"}, {"y", "mask"}), make("Mul", {"y", "mask"}, {"z"})}, x, {"z"}).g;
  std::string why = testing::error_of([&] { lift_opset(mask, 13, rules()); });
  EXPECT_NE(why.find("node 'Dropout_node' (Dropout)"), std::string::npos) << why;
  EXPECT_NE(why.find("'mask'"), std::string::npos) << why;
  EXPECT_EQ(mask.default_opset(), 9);
  EXPECT_EQ(mask.node(0).outputs.size(), 2u);

  Graph bn =
      single(8, {make("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y"}, {{"spatial", Attribute::of_int(0)}})},
             at::randn({2, 3, 4, 4}), {"y"}, {}, true)
          .g;
  why = testing::error_of([&] { lift_opset(bn, 13, rules(), static_value_facts(bn)); });
  EXPECT_NE(why.find("(BatchNormalization)"), std::string::npos) << why;
  EXPECT_NE(why.find("spatial"), std::string::npos) << why;

  Graph unknown = single(9, {make("MadeUpOp", {"x"}, {"y"})}, x, {"y"}).g;
  why = testing::error_of([&] { lift_opset(unknown, 13, rules()); });
  EXPECT_NE(why.find("node 'MadeUpOp_node' (MadeUpOp)"), std::string::npos) << why;
  EXPECT_NE(why.find("no loaded plugin registers MadeUpOp"), std::string::npos) << why;

  Node loop = make("Loop", {"", "", "x"}, {"y"});
  Attribute body;
  body.kind = Attribute::Kind::kOpaque;
  loop.attributes["body"] = body;
  Graph control = single(9, {loop}, x, {"y"}).g;
  why = testing::error_of([&] { lift_opset(control, 13, rules()); });
  EXPECT_NE(why.find("(Loop)"), std::string::npos) << why;
  EXPECT_NE(why.find("subgraph"), std::string::npos) << why;

  Graph groups =
      single(18, {make("GroupNormalization", {"x", "scale", "bias"}, {"y"}, {{"num_groups", Attribute::of_int(3)}})},
             at::randn({2, 6, 3}), {"y"}, {{"scale", at::randn({3})}, {"bias", at::randn({3})}})
          .g;
  why = testing::error_of([&] { lift_opset(groups, 21, rules()); });  // no facts: the channel count is unknown
  EXPECT_NE(why.find("number of channels"), std::string::npos) << why;
}

// The pipeline step: facts from one run, the lift, and the outputs checked on the sample.
TEST(OpsetLift, LiftModelChecksTheLiftOnTheSample) {
  Model m = load_onnx(testing::source_path("tests/fixtures/opset9_cnn.onnx"), ImportOptions{0});
  EXPECT_EQ(m.graph.default_opset(), 9);
  at::manual_seed(4);
  const LiftReport r = lift_model(m, 13, testing::shipped_registry(), {at::rand({3, 3, 16, 16})});
  EXPECT_EQ(r.from, 9);
  EXPECT_EQ(r.to, 13);
  EXPECT_TRUE(r.checked);
  EXPECT_LE(r.max_abs_diff, 1e-6);
  EXPECT_EQ(m.graph.default_opset(), 13);
  EXPECT_FALSE(r.rewrites.empty());
}

}  // namespace
}  // namespace sparsebit
