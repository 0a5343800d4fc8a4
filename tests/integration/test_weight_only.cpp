// Weight-only quantization through the pipeline (Note [Weight-only quantization] in config.cpp):
// [w] without [a], per-group 4-bit MatMul weights rounded by GPTQ in the layerwise runner, the
// exported graph run by our executor to the simulated outputs, in both weight formats
// (blocked DequantizeLinear and com.microsoft.MatMulNBits, Note [MatMulNBits export]).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "data_testing.h"
#include "quant/quant_model_access.h"
#include "sparsebit/core/matmul_nbits.h"
#include "sparsebit/core/quant_model.h"
#include "test_support.h"

namespace sparsebit {
namespace {

/// x [n, 32] -> MatMul(W) -> Tanh -> MatMul(W) -> y: one weight read by two layers whose inputs
/// differ, as exporters write weights tied across layers.
Graph tied_layers() {
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  at::manual_seed(11);
  g.initializers["w"] = at::randn({32, 32}) * 0.3;
  g.append(testing::make_node("first", "MatMul", {"x", "w"}, {"h"}));
  g.append(testing::make_node("act", "Tanh", {"h"}, {"t"}));
  g.append(testing::make_node("second", "MatMul", {"t", "w"}, {"y"}));
  return g;
}

TEST(WeightOnly, GptqRoundsATiedWeightPerLayerAndTheExportKeepsBoth) {
  const Config c = Config::from_string(R"(
[w]
qscheme = "per-group-symmetric"
bits = 4
group_size = 32
quantizer = "gptq"
[calibration]
mode = "asym"
batch_size = 256
)",
                                       "test.toml");
  EXPECT_TRUE(c.weight_only);
  QuantModel qm(Model{tied_layers(), {}}, c, testing::shipped_registry());
  at::manual_seed(12);
  const at::Tensor x = at::randn({256, 32}).mm(at::randn({32, 32}) * 0.4 + at::eye(32));
  testing::OneBatch data(x);
  const CalibrationStats stats = qm.calibrate(data);
  ASSERT_EQ(stats.reconstructions.size(), 2u);
  for (const auto& r : stats.reconstructions) {
    EXPECT_EQ(r.quantizer, "gptq");
    EXPECT_LT(r.mse_learnt, r.mse_nearest) << r.node;
  }
  // Activations stay float: only the two weight slots are active.
  std::size_t active = 0;
  for (const auto& s : qm.slots()) active += s.active() && QuantModelAccess::slots(qm).usable(s);
  EXPECT_EQ(active, 2u);

  const Graph g = qm.export_graph();
  int q = 0, dq = 0;
  for (const Node* n : g.nodes()) {
    q += n->op_type == "QuantizeLinear";
    dq += n->op_type == "DequantizeLinear";
  }
  EXPECT_EQ(q, 0);
  EXPECT_EQ(dq, 2) << "each layer keeps its own GPTQ integers of the shared weight";
  Executor ex(g, testing::shipped_registry());
  const at::Tensor from_export = ex.run({{"x", x}})[0];
  qm.set_quant(true, true);
  const at::Tensor simulated = qm.forward({x})[0];
  EXPECT_TRUE(at::allclose(from_export, simulated, 1e-5, 1e-5))
      << "max diff " << (from_export - simulated).abs().max().item<float>();
}

/// x [n, K] -> MatMul(W [K, 24]) -> Relu -> Gemm(V [16, 24], bias, transB) -> y.
Graph matmul_then_gemm(std::int64_t k) {
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  at::manual_seed(21);
  g.initializers["w"] = at::randn({k, 24}) * 0.3;
  g.initializers["v"] = at::randn({16, 24}) * 0.3;
  g.initializers["bias"] = at::randn({16});
  g.append(testing::make_node("mm", "MatMul", {"x", "w"}, {"h"}));
  g.append(testing::make_node("relu", "Relu", {"h"}, {"r"}));
  g.append(testing::make_node("fc", "Gemm", {"r", "v", "bias"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  return g;
}

// Every scheme MatMulNBits expresses: int4 symmetric (default zero point), uint4 affine (packed
// zero points), 8 bits, a ragged last block; our executor runs the MatMulNBits graph to the
// simulated outputs, which unpacks every code and zero point.
TEST(WeightOnly, MatMulNBitsExportRunsToTheSimulation) {
  struct Case {
    std::string qscheme;
    int bits;
    std::int64_t k, group;
  };
  for (const Case& t : {Case{"per-group-symmetric", 4, 32, 16}, Case{"per-group-affine", 4, 48, 32},
                        Case{"per-group-symmetric", 8, 32, 16}, Case{"per-group-affine", 8, 40, 16}}) {
    const std::string what = t.qscheme + " " + std::to_string(t.bits) + " bits, K " + std::to_string(t.k);
    const Config c = Config::from_string("[w]\nqscheme = \"" + t.qscheme + "\"\nbits = " + std::to_string(t.bits) +
                                             "\ngroup_size = " + std::to_string(t.group) +
                                             "\n[export]\nweight_format = \"matmul_nbits\"\naccuracy_level = 4\n",
                                         "test.toml");
    QuantModel qm(Model{matmul_then_gemm(t.k), {}}, c, testing::shipped_registry());
    at::manual_seed(22);
    const at::Tensor x = at::randn({64, t.k});
    testing::OneBatch data(x);
    qm.calibrate(data);
    const Graph g = qm.export_graph();
    int nbits = 0, dq = 0;
    for (const Node* n : g.nodes()) {
      if (n->op_type != "MatMulNBits") {
        dq += n->op_type == "DequantizeLinear";
        continue;
      }
      ++nbits;
      EXPECT_EQ(n->domain, "com.microsoft");
      EXPECT_EQ(n->attr_int("bits", 0), t.bits) << what;
      EXPECT_EQ(n->attr_int("block_size", 0), t.group) << what;
      EXPECT_EQ(n->attr_int("accuracy_level", -1), 4) << what;
      const bool affine = t.qscheme == "per-group-affine";
      EXPECT_EQ(n->has_input(3), affine) << what << ": zero points only where they are not the default";
    }
    EXPECT_EQ(nbits, 2) << what;
    EXPECT_EQ(dq, 0) << what;
    EXPECT_EQ(g.opset_imports.at("com.microsoft"), 1);
    Executor ex(g, testing::shipped_registry());
    const at::Tensor from_export = ex.run({{"x", x}})[0];
    qm.set_quant(true, true);
    const at::Tensor simulated = qm.forward({x})[0];
    EXPECT_TRUE(at::allclose(from_export, simulated, 1e-5, 1e-5))
        << what << ": max diff " << (from_export - simulated).abs().max().item<float>();
  }
}

TEST(WeightOnly, MatMulNBitsPacksLowBitsFirst) {
  // int4 symmetric codes q in [-8, 7] are stored as q + 8; the first code of a byte is its low
  // nibble. A weight whose column k holds integers chosen by hand: w[k][n] = s * q(k).
  Graph g;
  g.opset_imports[""] = 21;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  std::vector<std::int64_t> q(16);
  for (std::int64_t k = 0; k < 16; ++k) q[static_cast<std::size_t>(k)] = k - 8;  // -8 .. 7
  g.initializers["wq"] = at::tensor(q, at::kLong).reshape({16, 1}).to(at::kChar);
  g.narrow_types["wq"] = 22;
  g.initializers["ws"] = at::full({1, 1}, 0.5f);
  g.append(testing::make_node("dq", "DequantizeLinear", {"wq", "ws"}, {"w"},
                              {{"axis", Attribute::of_int(0)}, {"block_size", Attribute::of_int(16)}}));
  g.append(testing::make_node("mm", "MatMul", {"x", "w"}, {"y"}));
  const Graph before = g.clone();
  ASSERT_EQ(to_matmul_nbits(g, 0), 1u);
  const Node* m = g.find_node("mm_MatMulNBits");
  ASSERT_TRUE(m);
  const at::Tensor b = g.initializers.at(m->inputs[1]);
  ASSERT_EQ(b.sizes(), (std::vector<std::int64_t>{1, 1, 8}));
  for (std::int64_t j = 0; j < 8; ++j)  // codes 2j and 2j + 1 (q + 8): low nibble 2j
    EXPECT_EQ(b[0][0][j].item<int>(), (2 * j) | ((2 * j + 1) << 4)) << "byte " << j;
  const at::Tensor x = at::randn({3, 16});
  Executor a(before, testing::shipped_registry()), c(g, testing::shipped_registry());
  EXPECT_TRUE(at::allclose(a.run({{"x", x}})[0], c.run({{"x", x}})[0], 1e-6, 1e-6));
}

TEST(WeightOnly, GptqInStreamingModeSaysWhichModeItNeeds) {
  const Config c = Config::from_string(
      "[w]\nqscheme = \"per-group-symmetric\"\nbits = 4\ngroup_size = 32\n"
      "quantizer = \"gptq\"\n",
      "test.toml");
  QuantModel qm(Model{tied_layers(), {}}, c, testing::shipped_registry());
  testing::OneBatch data(at::randn({16, 32}));
  const std::string msg = testing::error_of([&] { qm.calibrate(data); });
  EXPECT_NE(msg.find("quantizer 'gptq', which solves the weight from the layer's inputs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mode = \"layerwise\" or \"asym\""), std::string::npos) << msg;
}

// awq is a graph pass, not a quantizer: the message says where it goes.
TEST(WeightOnly, AwqAsAQuantizerNamesTheScheduleKey) {
  const Config c = Config::from_string(
      "[w]\nqscheme = \"per-group-affine\"\nbits = 4\ngroup_size = 32\nquantizer = \"awq\"\n", "awq.toml");
  const std::string msg = testing::error_of([&] {
    QuantModel qm(Model{tied_layers(), {}}, c, testing::shipped_registry());
  });
  EXPECT_NE(msg.find("quantizer 'awq' is not provided"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'awq' is a pass: keep a quantizer here (rtn, gptq) and turn it on with [schedule] awq = true"),
            std::string::npos)
      << msg;
}

/// ids [n, 5] -> Gather(table [50, 32]) -> MatMul(w [32, 8]) -> y, and an int64 constant looked
/// up by a second Gather (a shape chain's kind of table) -> d.
Graph embedding_model() {
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"ids", 7, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"d", 7, false, {}, ""});
  at::manual_seed(31);
  const at::Tensor row_scale =
      at::rand({50, 1});  // its own statement: compilers order draws within one expression differently
  g.initializers["table"] = at::randn({50, 32}) * row_scale + 0.2;
  g.initializers["w"] = at::randn({32, 8}) * 0.3;
  g.initializers["dims"] = at::tensor(std::vector<std::int64_t>{2, 5, 32}, at::kLong);
  g.initializers["which"] = at::tensor(1, at::kLong);
  g.append(testing::make_node("embed", "Gather", {"table", "ids"}, {"e"}));
  g.append(testing::make_node("proj", "MatMul", {"e", "w"}, {"y"}));
  g.append(testing::make_node("dim", "Gather", {"dims", "which"}, {"d"}));
  return g;
}

/// Affine rounding per group of `group` along `axis` of a 2-D tensor, written out here from
/// Note [Quantization arithmetic] (range widened to include 0).
at::Tensor affine_groups(const at::Tensor& x, std::int64_t axis, std::int64_t group, int bits) {
  const at::Tensor t = axis == 1 ? x : x.t();
  const std::int64_t rows = t.size(0), n = t.size(1);
  const at::Tensor blocks = t.reshape({rows, n / group, group});
  const at::Tensor lo = std::get<0>(blocks.min(-1, true)).clamp_max(0);
  const at::Tensor hi = std::get<0>(blocks.max(-1, true)).clamp_min(0);
  const double qmax = (1 << bits) - 1;
  const at::Tensor scale = ((hi - lo) / qmax).clamp_min(kMinScale);
  const at::Tensor zp = at::round(-lo / scale).clamp(0, qmax);
  const at::Tensor q = (at::round(blocks / scale) + zp).clamp(0, qmax);
  const at::Tensor out = ((q - zp) * scale).reshape({rows, n});
  return axis == 1 ? out : out.t();
}

TEST(WeightOnly, EmbeddingTablesAreGroupedAlongTheirRowsWhenAsked) {
  const std::string w = "[w]\nqscheme = \"per-group-affine\"\nbits = 4\ngroup_size = 16\nquantizer = \"rtn\"\n";
  const at::Tensor ids = at::randint(0, 50, {4, 5}, at::kLong);
  testing::OneBatch data(ids);
  {  // by default embeddings stay float
    QuantModel qm(Model{embedding_model(), {}}, Config::from_string(w, "test.toml"), testing::shipped_registry());
    for (const auto& s : qm.slots()) EXPECT_NE(s.node_name, "embed") << "embeddings stay float unless asked";
  }
  QuantModel qm(Model{embedding_model(), {}}, Config::from_string(w + "embeddings = true\n", "test.toml"),
                testing::shipped_registry());
  const QuantSlot* table = nullptr;
  for (const auto& s : qm.slots()) {
    EXPECT_NE(s.node_name, "dim") << "an integer constant is no embedding";
    if (s.node_name == "embed") table = &s;
  }
  ASSERT_TRUE(table);
  EXPECT_TRUE(table->lookup_table);
  EXPECT_EQ(table->input_index, 0u);
  EXPECT_EQ(table->spec.group_axis, 1) << "groups run along the embedding dimension";
  qm.calibrate(data);
  qm.set_quant(true, true);
  const Graph& g = embedding_model();
  const at::Tensor expected = at::matmul(
      affine_groups(g.initializers.at("table"), 1, 16, 4).index_select(0, ids.reshape(-1)).reshape({4, 5, 32}),
      affine_groups(g.initializers.at("w"), 0, 16, 4));
  const at::Tensor simulated = qm.forward({ids})[0];
  EXPECT_TRUE(at::allclose(simulated, expected, 1e-5, 1e-5))
      << "max diff " << (simulated - expected).abs().max().item<float>();

  for (const char* format : {"dequantize_linear", "matmul_nbits"}) {
    QuantModel m(
        Model{embedding_model(), {}},
        Config::from_string(w + "embeddings = true\n[export]\nweight_format = \"" + format + "\"\n", "test.toml"),
        testing::shipped_registry());
    testing::OneBatch again(ids);
    m.calibrate(again);
    Graph out = m.export_graph();
    const Node* gather = out.find_node("embed");
    ASSERT_TRUE(gather);
    const Node* dq = out.producer(gather->inputs[0]);
    ASSERT_TRUE(dq && dq->op_type == "DequantizeLinear") << format;
    EXPECT_EQ(dq->attr_int("axis", 0), 1) << format;
    EXPECT_EQ(dq->attr_int("block_size", 0), 16) << format;
    EXPECT_EQ(out.narrow_types.at(dq->inputs[0]), 21) << format << ": uint4 integers";
    Executor ex(out, testing::shipped_registry());
    const at::Tensor from_export = ex.run({{"ids", ids}})[0];
    EXPECT_TRUE(at::allclose(from_export, expected, 1e-5, 1e-5))
        << format << ": max diff " << (from_export - expected).abs().max().item<float>();
  }
  const std::string msg = testing::error_of([] { Config::from_string("[a]\nembeddings = true\n", "e.toml"); });
  EXPECT_NE(msg.find("a.embeddings: embedding tables are weights; set it in [w]"), std::string::npos) << msg;
}

TEST(WeightOnly, ASpecificEntryTurnsActivationsOnForItsNodes) {
  const Config c = Config::from_string(R"(
[w]
bits = 8
[[specific]]
nodes = ["second"]
a = { bits = 8 }
)",
                                       "test.toml");
  EXPECT_TRUE(c.weight_only);
  EXPECT_TRUE(c.a.disable);
  ASSERT_EQ(c.specific.size(), 1u);
  EXPECT_FALSE(c.specific[0].a.disable);
  const Config both = Config::from_string("[w]\nbits = 8\n[a]\nbits = 8\n", "test.toml");
  EXPECT_FALSE(both.weight_only);
  EXPECT_FALSE(both.a.disable);
}

}  // namespace
}  // namespace sparsebit
