// The shipped backends' rules (which schemes each deploys, refused with the key and the fix) and
// their placement (what each keeps float, which residual branch TensorRT quantizes), driven
// through the SDK's Backend and QuantState interfaces as the host drives them.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <utility>

#include "test_support.h"

namespace sparsebit::testing {
namespace {

std::unique_ptr<Backend> backend(const std::string& name) {
  const auto* e = shipped_registry().backend(name);
  if (!e) throw Error("backend " + name + " not loaded");
  return e->factory();
}

QSpec spec(int bits, bool symmetric, bool per_channel, bool is_weight) {
  QSpec s;
  s.bits = bits;
  s.symmetric = symmetric;
  s.per_channel = per_channel;
  s.is_weight = is_weight;
  return s;
}

// Which (scheme, backend) pairs deploy; a refusal names the table's key and says what to set.
TEST(Backends, EachBackendAcceptsTheSchemesItDeploysAndNamesTheKeyOfOneItDoesNot) {
  struct Case {
    const char* name;
    QSpec s;
    bool virtual_ok, onnxruntime_ok, tensorrt_ok;
    const char* key;  // in the refusals
  };
  QSpec reduced = spec(7, true, true, true);
  reduced.reduce_range = true;
  QSpec grouped = spec(8, true, false, true);
  grouped.group_size = 32;
  const Case cases[] = {
      {"W8 per-channel symmetric", spec(8, true, true, true), true, true, true, ""},
      {"A8 per-tensor symmetric", spec(8, true, false, false), true, true, true, ""},
      {"A8 per-tensor affine", spec(8, false, false, false), true, true, false, ".qscheme"},
      {"A8 per-channel symmetric", spec(8, true, true, false), true, true, false, ".qscheme"},
      {"W4", spec(4, true, true, true), true, false, false, ".bits = 4"},
      {"A16", spec(16, false, false, false), true, true, false, ".bits = 16"},
      {"W16", spec(16, true, true, true), false, false, false, ".bits = 16"},
      {"W7 reduce_range", reduced, true, true, false, ".reduce_range"},
      {"W8 per-group", grouped, true, true, false, ".qscheme"},
  };
  for (const Case& c : cases) {
    for (auto [name, ok] : {std::pair<const char*, bool>{"virtual", c.virtual_ok},
                            {"onnxruntime", c.onnxruntime_ok},
                            {"tensorrt", c.tensorrt_ok}}) {
      const auto why = backend(name)->check(c.s, "[w]");
      EXPECT_EQ(!why.has_value(), ok) << c.name << " on " << name << (why ? ": " + *why : std::string());
      if (why) {
        EXPECT_EQ(why->rfind("[w]", 0), 0u) << *why;
        if (std::string(name) == "tensorrt") EXPECT_NE(why->find(c.key), std::string::npos) << c.name << ": " << *why;
      }
    }
  }
  // ONNX Runtime's QLinearConv/QGemm add an int32 bias; TensorRT keeps biases float.
  EXPECT_TRUE(backend("onnxruntime")->quantize_bias());
  EXPECT_FALSE(backend("tensorrt")->quantize_bias());
}

// Records what placement asks of the state: the bypassed inputs and the quantized activations.
class RecordingState final : public QuantState {
 public:
  explicit RecordingState(const Graph& g) : g_(g) {}
  const Graph& graph() const override { return g_; }
  bool is_quantized(const Node& n, std::size_t i) const override { return !fused.count({n.name, i}); }
  void set_fake_fused(const Node& n, std::size_t i, bool on) override {
    if (on) fused.insert({n.name, i});
    else fused.erase({n.name, i});
  }
  bool quantize_activation(const Node& n, std::size_t i) override {
    quantized.insert({n.name, i});
    return true;
  }
  std::set<std::pair<std::string, std::size_t>> fused, quantized;

 private:
  const Graph& g_;
};

// conv(x) + y: a residual block; conv(x) + b: a bias add; an LSTM; an If whose branch holds a MatMul.
Graph placement_graph() {
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, false, {}, ""}, {"y", 1, false, {}, ""}, {"c", 9, false, {}, ""}};
  g.initializers["w"] = at::randn({4, 4, 1, 1});
  g.initializers["b"] = at::randn({1, 4, 1, 1});
  g.initializers["lw"] = at::randn({1, 32, 4});
  g.initializers["lr"] = at::randn({1, 32, 8});
  g.initializers["mw"] = at::randn({4, 4});
  g.append(make_node("conv", "Conv", {"x", "w"}, {"h"}));
  g.append(make_node("residual", "Add", {"y", "h"}, {"r"}));
  g.append(make_node("bias", "Add", {"h", "b"}, {"hb"}));
  g.append(make_node("lstm", "LSTM", {"seq", "lw", "lr"}, {"ls"}));
  Graph then_branch, else_branch;
  then_branch.outputs.push_back({"t", 1, false, {}, ""});
  then_branch.append(make_node("then_mm", "MatMul", {"seq", "mw"}, {"t"}));
  else_branch.outputs.push_back({"e", 1, false, {}, ""});
  else_branch.append(make_node("else_id", "Identity", {"seq"}, {"e"}));
  Node cond = make_node("if", "If", {"c"}, {"z"});
  cond.attributes["then_branch"] = Attribute::of_graph(std::move(then_branch));
  cond.attributes["else_branch"] = Attribute::of_graph(std::move(else_branch));
  g.append(std::move(cond));
  return g;
}

TEST(Backends, TensorRTQuantizesTheSkipBranchAndKeepsRecurrentAndControlFlowFloat) {
  const Graph g = placement_graph();
  RecordingState s(g);
  backend("tensorrt")->place(s);
  using P = std::pair<std::string, std::size_t>;
  // The Conv's output is read inside its kernel; the skip branch y comes in as INT8.
  EXPECT_TRUE(s.fused.count(P{"residual", 1}));
  EXPECT_FALSE(s.fused.count(P{"residual", 0}));
  EXPECT_EQ(s.quantized, (std::set<P>{{"residual", 0}}));
  EXPECT_FALSE(s.fused.count(P{"bias", 0})) << "an Add of a constant is a bias, not a residual";
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(s.fused.count(P{"lstm", i})) << "LSTM input " << i;
  EXPECT_TRUE(s.fused.count(P{"then_mm", 0}));
  EXPECT_TRUE(s.fused.count(P{"then_mm", 1}));
  EXPECT_TRUE(s.fused.count(P{"else_id", 0}));
  EXPECT_FALSE(s.fused.count(P{"conv", 0}));
}

TEST(Backends, OnnxRuntimeKeepsOnlyRecurrentLayersFloat) {
  const Graph g = placement_graph();
  RecordingState s(g);
  backend("onnxruntime")->place(s);
  using P = std::pair<std::string, std::size_t>;
  EXPECT_EQ(s.fused, (std::set<P>{{"lstm", 0}, {"lstm", 1}, {"lstm", 2}}));
  EXPECT_TRUE(s.quantized.empty());
  RecordingState untouched(g);
  backend("virtual")->place(untouched);
  EXPECT_TRUE(untouched.fused.empty() && untouched.quantized.empty());
}

}  // namespace
}  // namespace sparsebit::testing
