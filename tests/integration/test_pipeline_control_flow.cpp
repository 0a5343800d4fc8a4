// The pipeline on control flow: If and Loop bodies calibrated, exported with Q/DQ inside, trip
// counts as ONNX says, branches the calibration never takes left float, TensorRT keeping bodies
// float.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

#include "pipeline_support.h"

namespace sparsebit::pipeline_tests {
namespace {

// y = If(mean(x) > 0, x @ Wt (a then-branch initializer), x @ We (an enclosing one)), then a
// Loop of three steps h <- h @ Wl. Every MatMul is quantized where it sits.
Model control_flow_model() {
  using testing::make_node;
  Model m;
  Graph& g = m.graph;
  g.opset_imports[""] = 13;
  g.inputs.push_back({"x", 1, true, {{-1, "n"}, {4, ""}}, ""});
  g.outputs.push_back({"z", 1, true, {{-1, "n"}, {4, ""}}, ""});
  at::manual_seed(5);
  g.initializers["we"] = at::randn({4, 4});
  g.initializers["wl"] = at::eye(4) * 1.5 + 0.1 * at::randn({4, 4});  // values grow step by step
  g.initializers["zero"] = at::zeros({});
  g.initializers["steps"] = at::full({}, 3, at::kLong);
  g.append(make_node("mean", "ReduceMean", {"x"}, {"m"}));
  g.nodes().back()->attributes["keepdims"] = Attribute::of_int(0);
  g.append(make_node("positive", "Greater", {"m", "zero"}, {"c"}));
  Graph then_branch, else_branch, body;
  then_branch.outputs.push_back({"yt", 1, false, {}, ""});
  then_branch.initializers["wt"] = at::randn({4, 4});
  then_branch.append(make_node("then_mm", "MatMul", {"x", "wt"}, {"yt"}));
  else_branch.outputs.push_back({"ye", 1, false, {}, ""});
  else_branch.append(make_node("else_mm", "MatMul", {"x", "we"}, {"ye"}));
  Node cond = make_node("if", "If", {"c"}, {"y"});
  cond.attributes["then_branch"] = Attribute::of_graph(std::move(then_branch));
  cond.attributes["else_branch"] = Attribute::of_graph(std::move(else_branch));
  g.append(std::move(cond));
  body.inputs = {{"i", 7, false, {}, ""}, {"going", 9, false, {}, ""}, {"h", 1, false, {}, ""}};
  body.outputs = {{"going_out", 9, false, {}, ""}, {"h_next", 1, false, {}, ""}};
  body.append(make_node("keep_going", "Identity", {"going"}, {"going_out"}));
  body.append(make_node("loop_mm", "MatMul", {"h", "wl"}, {"h_next"}));
  Node loop = make_node("loop", "Loop", {"steps", "", "y"}, {"z"});
  loop.attributes["body"] = Attribute::of_graph(std::move(body));
  g.append(std::move(loop));
  g.topological_sort();
  return m;
}

// ONNX's Loop: a trip count M and a condition; with the condition true it runs max(M, 0) times
// (onnx.reference's Loop does `while cond and (M is None or i < M)`), so a negative M runs none.
TEST(Pipeline, LoopTripCountsFollowOnnx) {
  using testing::make_node;
  for (const std::int64_t m : {-5, 0, 3}) {
    Graph g;
    g.opset_imports[""] = 16;
    g.inputs.push_back({"x", 1, true, {{2, ""}}, ""});
    g.outputs.push_back({"z", 1, true, {{2, ""}}, ""});
    g.initializers["trips"] = at::full({}, m, at::kLong);
    g.initializers["always"] = at::ones({}, at::kBool);
    Graph body;
    body.inputs = {{"i", 7, false, {}, ""}, {"going", 9, false, {}, ""}, {"h", 1, false, {}, ""}};
    body.outputs = {{"going_out", 9, false, {}, ""}, {"h_next", 1, false, {}, ""}};
    body.initializers["one"] = at::ones({});
    body.append(make_node("keep_going", "Identity", {"going"}, {"going_out"}));
    body.append(make_node("step", "Add", {"h", "one"}, {"h_next"}));
    Node loop = make_node("loop", "Loop", {"trips", "always", "x"}, {"z"});
    loop.attributes["body"] = Attribute::of_graph(std::move(body));
    g.append(std::move(loop));
    Executor ex(g, testing::shipped_registry());
    const at::Tensor x = at::tensor({1.5f, -2.0f});
    const at::Tensor z = ex.run({{"x", x}})[0];
    EXPECT_TRUE(at::equal(z, x + static_cast<float>(std::max<std::int64_t>(m, 0)))) << "M = " << m << ": " << z;
  }
}

TEST(Pipeline, IfBranchesOfDifferentElementTypesAreRefused) {
  using testing::make_node;
  Graph g;
  g.opset_imports[""] = 16;
  g.inputs.push_back({"c", 9, true, {}, ""});
  g.outputs.push_back({"y", 1, true, {}, ""});
  Graph then_branch, else_branch;
  then_branch.initializers["f"] = at::ones({2});
  then_branch.outputs.push_back({"yf", 1, true, {{2, ""}}, ""});
  then_branch.append(make_node("tf", "Identity", {"f"}, {"yf"}));
  else_branch.initializers["l"] = at::ones({2}, at::kLong);
  else_branch.outputs.push_back({"yl", 7, true, {{2, ""}}, ""});
  else_branch.append(make_node("el", "Identity", {"l"}, {"yl"}));
  Node cond = make_node("branchy", "If", {"c"}, {"y"});
  cond.attributes["then_branch"] = Attribute::of_graph(std::move(then_branch));
  cond.attributes["else_branch"] = Attribute::of_graph(std::move(else_branch));
  g.append(std::move(cond));
  const std::string e = testing::error_of([&] { Executor ex(g, testing::shipped_registry()); });
  for (const char* needle : {"branchy", "output 0", "float", "int64", "yl"})
    EXPECT_NE(e.find(needle), std::string::npos) << needle << " missing in: " << e;
}

std::size_t count_ops(const Graph& g, const std::string& op) {
  std::size_t n = 0;
  for (const Node* node : g.nodes()) n += node->op_type == op;
  return n;
}

TEST(Pipeline, ControlFlowBodiesAreCalibratedAndExportedWithQdq) {
  testing::TempDir dir;
  at::manual_seed(6);
  at::Tensor samples = at::cat({at::randn({6, 4}) + 2, at::randn({6, 4}) - 2});  // both branches
  write_npy(samples, dir / "x.npy");
  Model ref = control_flow_model();
  const at::Tensor wt = ref.graph.find_node("if")->attributes.at("then_branch").graph->initializers.at("wt");
  const at::Tensor we = ref.graph.initializers.at("we"), wl = ref.graph.initializers.at("wl");
  for (const std::string mode : {"streaming", "layerwise", "asym"}) {
    Config c = config_for("w8a8_onnxruntime.toml", 12, mode);
    c.calibration.batch_size = 1;  // each sample takes its own branch
    QuantModel qm(control_flow_model(), c, testing::shipped_registry());
    auto data = open_dataset(dir / "x.npy", qm.graph().inputs);
    qm.calibrate(*data);
    std::map<std::string, int> quantized;
    for (const auto& s : qm.slots())
      if (s.active() && s.calibrated) quantized[s.node_name] += s.role == InputRole::kWeight ? 10 : 1;
    for (const char* mm : {"then_mm", "else_mm", "loop_mm"})
      EXPECT_EQ(quantized[mm], 11) << mode << ": " << mm << " has its weight and activation quantized";

    // The loop body's observer saw every step (float values): h0 = y, h1 = y Wl, h2 = y Wl^2.
    double lo = 0, hi = 0, lo_first = 0, hi_first = 0;
    for (std::int64_t r = 0; r < samples.size(0); ++r) {
      at::Tensor x = samples.slice(0, r, r + 1);
      at::Tensor h = at::matmul(x, x.mean().item<float>() > 0 ? wt : we);
      lo_first = std::min(lo_first, h.min().item<double>());
      hi_first = std::max(hi_first, h.max().item<double>());
      for (int step = 0; step < 3; ++step, h = at::matmul(h, wl)) {
        lo = std::min(lo, h.min().item<double>());
        hi = std::max(hi, h.max().item<double>());
      }
    }
    if (mode != "asym") {  // asym observes the quantized stream outside bodies; the loop's input differs
      for (const auto& s : qm.slots())
        if (s.node_name == "loop_mm" && s.role == InputRole::kActivation)
          EXPECT_NEAR(s.quantizer->qparams().scale.item<double>(), (hi - lo) / 255, 1e-6) << mode;
      EXPECT_GT(hi - lo, 1.5 * (hi_first - lo_first)) << "the steps widen the range";
    }

    // Q/DQ inside each body, and the exported graph computes what the simulation computes.
    Graph exported = qm.export_graph();
    const Node& if_node = *exported.find_node("if");
    for (const char* b : {"then_branch", "else_branch"}) {
      const Graph& branch = *if_node.attributes.at(b).graph;
      EXPECT_EQ(count_ops(branch, "QuantizeLinear"), 1u) << mode << " " << b;
      EXPECT_EQ(count_ops(branch, "DequantizeLinear"), 2u) << mode << " " << b;
    }
    const Graph& loop_body = *exported.find_node("loop")->attributes.at("body").graph;
    EXPECT_EQ(count_ops(loop_body, "QuantizeLinear"), 1u) << mode;
    EXPECT_NO_THROW(exported.validate());
    Executor deployed(exported, testing::shipped_registry());
    qm.set_quant(true, true);
    for (std::int64_t r : {0, 9}) {
      at::Tensor x = samples.slice(0, r, r + 1);
      at::Tensor simulated = qm.forward({x})[0];
      at::Tensor run = deployed.run({{"x", x}})[0];
      EXPECT_TRUE(at::allclose(run, simulated, 1e-5, 1e-5)) << mode << " sample " << r;
      qm.set_quant(false, false);
      EXPECT_GT((qm.forward({x})[0] - simulated).abs().max().item<double>(), 0) << "quantization changes z";
      qm.set_quant(true, true);
    }
  }
}

TEST(Pipeline, ABranchTheCalibrationNeverTakesStaysFloat) {
  testing::TempDir dir;
  write_npy(at::randn({8, 4}) + 3, dir / "x.npy");  // always the then-branch
  QuantModel qm(control_flow_model(), config_for("w8a8_onnxruntime.toml", 8, "layerwise"), testing::shipped_registry());
  auto data = open_dataset(dir / "x.npy", qm.graph().inputs);
  qm.calibrate(*data);
  for (const auto& s : qm.slots()) {
    if (s.node_name != "else_mm") continue;
    if (s.role == InputRole::kActivation) EXPECT_FALSE(s.active()) << "nothing observed it";
    else EXPECT_TRUE(s.active() && s.calibrated) << "a weight needs no data";
  }
  Graph exported = qm.export_graph();
  EXPECT_EQ(count_ops(*exported.find_node("if")->attributes.at("else_branch").graph, "QuantizeLinear"), 0u);
  EXPECT_NO_THROW(exported.validate());
}

TEST(Pipeline, TensorRTKeepsControlFlowBodiesFloat) {
  QuantModel qm(control_flow_model(), config_for("w8a8_tensorrt.toml"), testing::shipped_registry());
  std::size_t nested = 0;
  for (const auto& s : qm.slots()) {
    if (s.node_name.find("_mm") == std::string::npos) continue;
    ++nested;
    EXPECT_FALSE(s.active()) << s.where();
  }
  EXPECT_EQ(nested, 6u);
}

}  // namespace
}  // namespace sparsebit::pipeline_tests
