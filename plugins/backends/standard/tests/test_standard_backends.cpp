// The shipped backends' rules (which schemes each deploys, refused with the key and the fix) and
// their placement (what each keeps float, which residual branch TensorRT quantizes), driven
// through the SDK's Backend and QuantState interfaces as the host drives them.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
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

TEST(Backends, OnnxRuntimeKeepsRecurrentLayersFloatAndVirtualPlacesNothing) {
  const Graph g = placement_graph();
  RecordingState s(g);
  backend("onnxruntime")->place(s);
  using P = std::pair<std::string, std::size_t>;
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(s.fused.count(P{"lstm", i})) << "LSTM input " << i;
  EXPECT_FALSE(s.fused.count(P{"then_mm", 0})) << "bodies keep the ops' roles";
  RecordingState untouched(g);
  backend("virtual")->place(untouched);
  EXPECT_TRUE(untouched.fused.empty() && untouched.quantized.empty());
}

// Quantizers as the host keeps them: the slots the ops' roles made, bypassed or not, new ones
// where quantize_activation asks (refused for a skipped node), sizes where the test gives them.
class SlotState final : public QuantState {
 public:
  using P = std::pair<std::string, std::size_t>;
  SlotState(const Graph& g, std::set<P> slots) : g_(g), slots(std::move(slots)) {}
  const Graph& graph() const override { return g_; }
  bool is_quantized(const Node& n, std::size_t i) const override {
    return slots.count({n.name, i}) && !fused.count({n.name, i});
  }
  void set_fake_fused(const Node& n, std::size_t i, bool on) override {
    if (!slots.count({n.name, i})) return;
    if (on) fused.insert({n.name, i});
    else fused.erase({n.name, i});
  }
  bool quantize_activation(const Node& n, std::size_t i) override {
    if (skipped.count(n.name) || g_.initializers.count(n.inputs[i])) return false;
    slots.insert({n.name, i});
    fused.erase({n.name, i});
    return true;
  }
  std::int64_t value_elements(const std::string& v) const override {
    auto it = sizes.find(v);
    return it == sizes.end() ? -1 : it->second;
  }
  void tie_grid(const Node& n, std::size_t i, const Node& source, std::size_t source_input) override {
    ties[{n.name, i}] = {source.name, source_input};
  }
  bool active(const std::string& node, std::size_t i) const {
    return slots.count({node, i}) && !fused.count({node, i});
  }

  std::set<P> slots, fused;
  std::map<P, P> ties;  // reader -> the input whose grid it takes
  std::set<std::string> skipped;
  std::map<std::string, std::int64_t> sizes;

 private:
  const Graph& g_;
};

Graph conv_graph(const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& weights) {
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, false, {}, ""}};
  for (const auto& [name, shape] : weights) g.initializers[name] = at::randn(shape);
  return g;
}

// PP-OCR's HardSwish written out reads the convolution's output twice, once through an Add the
// roles quantize and once through a Mul they do not: ONNX Runtime would run the convolution in
// float. The placement quantizes the Mul's input too, so one Q takes the output.
TEST(Backends, OnnxRuntimeGivesAnIntegerLayerOneQuantizeLinearForAllItsReaders) {
  Graph g = conv_graph({{"w1", {64, 64, 3, 3}}, {"b1", {64}}, {"w2", {64, 64, 1, 1}}, {"b2", {64}}});
  g.initializers["three"] = at::full({}, 3.0);
  g.initializers["lo"] = at::full({}, 0.0);
  g.initializers["hi"] = at::full({}, 6.0);
  g.outputs = {{"y", 1, false, {}, ""}};
  g.append(make_node("conv1", "Conv", {"x", "w1", "b1"}, {"h"}));
  g.append(make_node("add3", "Add", {"h", "three"}, {"a"}));
  g.append(make_node("clip", "Clip", {"a", "lo", "hi"}, {"c"}));
  g.append(make_node("mul", "Mul", {"h", "c"}, {"m"}));
  g.append(make_node("conv2", "Conv", {"m", "w2", "b2"}, {"y2"}));
  g.append(make_node("relu", "Relu", {"y2"}, {"y"}));
  SlotState s(g, {{"conv1", 0}, {"conv1", 1}, {"conv1", 2}, {"add3", 0}, {"conv2", 0}, {"conv2", 1}, {"conv2", 2}});
  backend("onnxruntime")->place(s);
  EXPECT_TRUE(s.active("conv1", 0) && s.active("conv1", 1) && s.active("conv1", 2));
  EXPECT_TRUE(s.active("add3", 0) && s.active("mul", 0)) << "both readers of conv1's output read one Q/DQ";
  EXPECT_FALSE(s.active("mul", 1)) << "the clip's output is made by float ops and read by one";
  // conv2's output leaves the model through the Relu: no Q can follow it, so it stays float,
  // weights included (ONNX Runtime would dequantize them on every run).
  EXPECT_FALSE(s.active("conv2", 0) || s.active("conv2", 1) || s.active("conv2", 2));
}

// Conv -> Relu -> Conv: the Relu is dropped by the Q after it (an unsigned grid), so its input
// stays unquantized and the first convolution's Q reads the Relu's output.
TEST(Backends, OnnxRuntimeLetsTheQuantizeLinearAfterAReluTakeTheRelu) {
  Graph g = conv_graph({{"w1", {32, 16, 3, 3}}, {"w2", {32, 32, 3, 3}}, {"w3", {10, 32}}});
  g.outputs = {{"y", 1, false, {}, ""}};
  g.append(make_node("conv1", "Conv", {"x", "w1"}, {"h"}));
  g.append(make_node("relu", "Relu", {"h"}, {"r"}));
  g.append(make_node("conv2", "Conv", {"r", "w2"}, {"h2"}));
  g.append(make_node("pool", "GlobalAveragePool", {"h2"}, {"p"}));
  g.append(make_node("flat", "Flatten", {"p"}, {"f"}));
  g.append(make_node("fc", "MatMul", {"f", "w3"}, {"y"}));
  SlotState s(g,
              {{"conv1", 0}, {"conv1", 1}, {"relu", 0}, {"conv2", 0}, {"conv2", 1}, {"pool", 0}, {"fc", 0}, {"fc", 1}});
  backend("onnxruntime")->place(s);
  EXPECT_FALSE(s.active("relu", 0));
  EXPECT_TRUE(s.active("conv2", 0));
  EXPECT_TRUE(s.active("pool", 0)) << "QLinearGlobalAveragePool between two integer ops";
  EXPECT_TRUE(s.active("flat", 0)) << "the pool's Q before the Flatten, which runs on 8-bit data";
  EXPECT_TRUE(s.active("fc", 0) && s.active("fc", 1)) << "a MatMul writing a graph output: MatMulIntegerToFloat";
  EXPECT_EQ(s.ties, (std::map<SlotState::P, SlotState::P>{{{"fc", 0}, {"flat", 0}}}))
      << "the Flatten's DQ and Q on one grid: ONNX Runtime drops them";
}

// Conv -> Relu -> MaxPool -> Conv: the second convolution's input takes the grid of the
// MaxPool's, so that ONNX Runtime runs the MaxPool on 8-bit data (from opset 12, whose MaxPool
// takes 8-bit tensors).
TEST(Backends, OnnxRuntimeTiesTheGridsAroundAMaxPool) {
  for (const std::int64_t opset : {11, 13}) {
    Graph g = conv_graph({{"w1", {32, 16, 3, 3}}, {"w2", {32, 32, 3, 3}}});
    g.opset_imports[""] = opset;
    g.outputs = {{"y", 1, false, {}, ""}};
    g.append(make_node("conv1", "Conv", {"x", "w1"}, {"h"}));
    g.append(make_node("relu", "Relu", {"h"}, {"r"}));
    g.append(make_node("pool", "MaxPool", {"r"}, {"p"}, {{"kernel_shape", Attribute::of_ints({2, 2})}}));
    g.append(make_node("conv2", "Conv", {"p", "w2"}, {"h2"}));
    g.append(make_node("out", "Tanh", {"h2"}, {"y"}));
    SlotState s(g, {{"conv1", 0}, {"conv1", 1}, {"conv2", 0}, {"conv2", 1}});
    backend("onnxruntime")->place(s);
    EXPECT_TRUE(s.active("pool", 0) && s.active("conv2", 0)) << opset;
    if (opset >= 12) EXPECT_EQ(s.ties, (std::map<SlotState::P, SlotState::P>{{{"conv2", 0}, {"pool", 0}}}));
    else EXPECT_TRUE(s.ties.empty()) << "MaxPool before opset 12 takes no 8-bit tensors";
  }
}

// A depthwise convolution between float ops saves 9 multiply-adds an output element, less than
// the QuantizeLinear before it and the DequantizeLinear after it cost: it stays float. The same
// convolution between two integer layers costs no Q/DQ of its own and stays quantized.
TEST(Backends, OnnxRuntimeLeavesALayerFloatWhereItsQdqCostsMoreThanItSaves) {
  for (const bool between_integer_layers : {false, true}) {
    Graph g = conv_graph({{"wp", {32, 32, 1, 1}}, {"wd", {32, 1, 3, 3}}, {"wq", {32, 32, 1, 1}}});
    g.outputs = {{"y", 1, false, {}, ""}};
    const std::string before = between_integer_layers ? "Conv" : "Sigmoid";
    g.append(make_node("pre", "HardSigmoid", {"x"}, {"x1"}));
    if (between_integer_layers) g.append(make_node("pw", "Conv", {"x1", "wp"}, {"h"}));
    else g.append(make_node("pw", "HardSigmoid", {"x1"}, {"h"}));
    g.append(make_node("dw", "Conv", {"h", "wd"}, {"d"}));
    g.node(g.num_nodes() - 1).attributes["group"] = Attribute::of_int(32);
    g.node(g.num_nodes() - 1).attributes["pads"] = Attribute::of_ints({1, 1, 1, 1});
    if (between_integer_layers) g.append(make_node("pq", "Conv", {"d", "wq"}, {"q"}));
    else g.append(make_node("pq", "HardSigmoid", {"d"}, {"q"}));
    g.append(make_node("post", "Tanh", {"q"}, {"y"}));
    std::set<SlotState::P> slots{{"dw", 0}, {"dw", 1}};
    if (between_integer_layers) slots.insert({{"pw", 0}, {"pw", 1}, {"pq", 0}, {"pq", 1}});
    SlotState s(g, slots);
    for (const char* v : {"x", "x1", "h", "d", "q"}) s.sizes[v] = 32 * 28 * 28;
    backend("onnxruntime")->place(s);
    EXPECT_EQ(s.active("dw", 0), between_integer_layers);
    EXPECT_EQ(s.active("dw", 1), between_integer_layers) << "a float layer keeps float weights";
  }
}

// A reader that cannot be quantized (a `skip` glob) or reads in float (a recurrent layer) keeps
// its producer float: ONNX Runtime would find the output going to a Q and to a float op.
TEST(Backends, OnnxRuntimeKeepsAProducerFloatWhoseReaderCannotTakeItsQuantizeLinear) {
  for (const std::string reader : {"Sigmoid", "LSTM"}) {
    Graph g = conv_graph({{"w", {64, 64, 3, 3}}, {"lw", {1, 32, 64}}, {"lr", {1, 32, 8}}});
    g.outputs = {{"y", 1, false, {}, ""}};
    g.append(make_node("conv", "Conv", {"x", "w"}, {"h"}));
    g.append(make_node("kept", reader,
                       reader == "LSTM" ? std::vector<std::string>{"h", "lw", "lr"} : std::vector<std::string>{"h"},
                       {"y"}));
    SlotState s(g, {{"conv", 0}, {"conv", 1}});
    s.skipped.insert("kept");
    backend("onnxruntime")->place(s);
    EXPECT_FALSE(s.active("conv", 0)) << reader;
    EXPECT_FALSE(s.active("kept", 0)) << reader;
  }
}

// The export pads a shallow convolution's input (1 to 3 channels) for ONNX Runtime's fast integer kernel
// (Note [ONNX Runtime channel padding]): a Pad of the 8-bit input by its zero point and zero
// weights, the same sums; not where the kernel would not take the padded layer anyway (groups,
// output channels not a multiple of 8, an int8 input, asymmetric weights).
TEST(Backends, OnnxRuntimePadsAShallowConvolutionsInputChannels) {
  struct Case {
    std::string what;
    std::int64_t in, out, group;
    at::ScalarType x_type;
    int w_zero;
    bool padded;
  };
  for (const Case& c :
       {Case{"RGB input", 3, 16, 1, at::kByte, 0, true}, Case{"grayscale input", 1, 32, 1, at::kByte, 0, true},
        Case{"channels a multiple of 4", 8, 16, 1, at::kByte, 0, false},
        Case{"6 channels, deep enough for the general kernel", 6, 16, 1, at::kByte, 0, false},
        Case{"12 output channels", 3, 12, 1, at::kByte, 0, false}, Case{"grouped", 2, 16, 2, at::kByte, 0, false},
        Case{"int8 input", 3, 16, 1, at::kChar, 0, false}, Case{"asymmetric weights", 3, 16, 1, at::kByte, 1, false}}) {
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs = {{"xq", c.x_type == at::kByte ? 2 : 3, false, {}, ""}};
    g.outputs = {{"y", 1, false, {}, ""}};
    const at::Tensor w = at::randint(-127, 128, {c.out, c.in / c.group, 3, 3}, at::kChar);
    g.initializers["w"] = w;
    g.initializers["ws"] = at::rand({c.out}) + 0.1;
    g.initializers["wz"] = at::full({c.out}, c.w_zero, at::kChar);
    g.initializers["xs"] = at::full({}, 0.02f);
    g.initializers["xz"] = at::full({}, 7, c.x_type);
    g.append(make_node("dqx", "DequantizeLinear", {"xq", "xs", "xz"}, {"x"}));
    g.append(make_node("dqw", "DequantizeLinear", {"w", "ws", "wz"}, {"wf"}, {{"axis", Attribute::of_int(0)}}));
    g.append(make_node("conv", "Conv", {"x", "wf"}, {"y"}, {{"group", Attribute::of_int(c.group)}}));
    backend("onnxruntime")->adjust_export(g);
    g.topological_sort();
    g.validate();
    const Node& conv = *g.find_node("conv");
    const Node* pad = g.producer(g.producer(conv.inputs[0])->inputs[0]);
    ASSERT_EQ(pad != nullptr && pad->op_type == "Pad", c.padded) << c.what;
    if (!c.padded) {
      EXPECT_EQ(conv.inputs[1], "wf") << c.what;
      continue;
    }
    EXPECT_EQ(pad->inputs[0], "xq") << c.what;
    EXPECT_TRUE(at::equal(g.initializers.at(pad->inputs[2]), g.initializers.at("xz"))) << "pads with the zero point";
    const std::vector<std::int64_t> pads(g.initializers.at(pad->inputs[1]).data_ptr<std::int64_t>(),
                                         g.initializers.at(pad->inputs[1]).data_ptr<std::int64_t>() + 8);
    EXPECT_EQ(pads, (std::vector<std::int64_t>{0, 0, 0, 0, 0, 4 - c.in, 0, 0})) << c.what;
    const at::Tensor padded_w = g.initializers.at(g.producer(conv.inputs[1])->inputs[0]);
    ASSERT_EQ(padded_w.sizes().vec(), (std::vector<std::int64_t>{c.out, 4, 3, 3})) << c.what;
    EXPECT_TRUE(at::equal(padded_w.narrow(1, 0, c.in), w)) << c.what;
    EXPECT_EQ(padded_w.narrow(1, c.in, 4 - c.in).count_nonzero().item<std::int64_t>(), 0) << c.what;
    EXPECT_EQ(g.find_node("dqx"), nullptr) << "the DequantizeLinear nobody reads any more goes";
    EXPECT_EQ(g.initializers.count("w"), 0u) << c.what;
  }
}

}  // namespace
}  // namespace sparsebit::testing
