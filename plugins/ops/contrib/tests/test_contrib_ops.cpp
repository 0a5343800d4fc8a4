// ONNX Runtime's fused operators against ONNX Runtime itself: each op alone in a model on random
// inputs, every output compared; then a BERT layer and a decoder layer in the form ONNX Runtime's
// optimizer writes them, quantized, exported and run in ONNX Runtime against our simulation.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"
#include "op_testing.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using testing::expect_matches_ort;
using Case = testing::OpCase;

at::Tensor randn(std::vector<std::int64_t> shape, double scale = 1.0) { return at::randn(shape) * scale; }

class ContribOps : public testing::OrtOpTest {};

TEST_F(ContribOps, GeluFamily) {
  const at::Tensor x = randn({2, 5, 24}, 3), b = randn({24});
  expect_matches_ort({"Gelu", "com.microsoft", {}, {{"x", x}}, {"y"}});
  expect_matches_ort({"FastGelu", "com.microsoft", {}, {{"x", x}}, {"y"}});
  expect_matches_ort({"FastGelu", "com.microsoft", {}, {{"x", x}, {"b", b}}, {"y"}});
  expect_matches_ort({"BiasGelu", "com.microsoft", {}, {{"x", x}, {"b", b}}, {"y"}});
  expect_matches_ort({"QuickGelu", "com.microsoft", {}, {{"x", x}}, {"y"}});
  expect_matches_ort({"QuickGelu", "com.microsoft", {{"alpha", Attribute::of_float(1.3)}}, {{"x", x}}, {"y"}});
}

TEST_F(ContribOps, AttentionWithMasksPastAndCausality) {
  const at::Tensor x = randn({2, 5, 16}), w = randn({16, 48}, 0.3), b = randn({48}, 0.1);
  const auto heads = Attribute::of_int(4);
  const at::Tensor mask2d = at::tensor({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, at::kInt).reshape({2, 5});
  const at::Tensor ends = at::tensor({5, 3}, at::kInt);
  expect_matches_ort({"Attention", "com.microsoft", {{"num_heads", heads}}, {{"x", x}, {"w", w}, {"b", b}}, {"y"}});
  expect_matches_ort(
      {"Attention", "com.microsoft", {{"num_heads", heads}}, {{"x", x}, {"w", w}, {"b", b}, {"mask", mask2d}}, {"y"}});
  expect_matches_ort(
      {"Attention", "com.microsoft", {{"num_heads", heads}}, {{"x", x}, {"w", w}, {"b", b}, {"mask", ends}}, {"y"}});
  expect_matches_ort({"Attention",
                      "com.microsoft",
                      {{"num_heads", heads}, {"unidirectional", Attribute::of_int(1)}},
                      {{"x", x}, {"w", w}, {"b", b}},
                      {"y"}});
  expect_matches_ort({"Attention",
                      "com.microsoft",
                      {{"num_heads", heads},
                       {"qkv_hidden_sizes", Attribute::of_ints({16, 16, 8})},
                       {"scale", Attribute::of_float(0.3)}},
                      {{"x", x}, {"w", randn({16, 40}, 0.3)}, {"b", randn({40}, 0.1)}},
                      {"y"}});
  expect_matches_ort({"Attention",
                      "com.microsoft",
                      {{"num_heads", heads}, {"unidirectional", Attribute::of_int(1)}},
                      {{"x", x}, {"w", w}, {"b", b}, {"", {}}, {"past", randn({2, 2, 4, 3, 4})}},
                      {"y", "present"}});
}

TEST_F(ContribOps, MultiHeadAttentionWithPaddingAndPast) {
  const at::Tensor q = randn({2, 5, 16}), k = randn({2, 7, 16}), v = randn({2, 7, 16}), b = randn({48}, 0.1);
  const auto heads = Attribute::of_int(4);
  const at::Tensor padding = at::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, at::kInt).reshape({2, 7});
  expect_matches_ort(
      {"MultiHeadAttention", "com.microsoft", {{"num_heads", heads}}, {{"q", q}, {"k", k}, {"v", v}}, {"y"}});
  expect_matches_ort({"MultiHeadAttention",
                      "com.microsoft",
                      {{"num_heads", heads}},
                      {{"q", q}, {"k", k}, {"v", v}, {"b", b}, {"mask", padding}},
                      {"y"}});
  expect_matches_ort({"MultiHeadAttention",
                      "com.microsoft",
                      {{"num_heads", heads}, {"scale", Attribute::of_float(0.2)}},
                      {{"q", q}, {"k", k}, {"v", v}, {"", {}}, {"", {}}, {"attn_bias", randn({1, 4, 5, 7})}},
                      {"y"}});
  expect_matches_ort({"MultiHeadAttention",
                      "com.microsoft",
                      {{"num_heads", heads}},
                      {{"q", q},
                       {"k", randn({2, 5, 16})},
                       {"v", randn({2, 5, 16})},
                       {"", {}},
                       {"", {}},
                       {"", {}},
                       {"past_k", randn({2, 4, 3, 4})},
                       {"past_v", randn({2, 4, 3, 4})}},
                      {"y", "present_k", "present_v"}});
}

TEST_F(ContribOps, RotaryEmbeddingHalvesPairsAndPartialDims) {
  const at::Tensor cos_cache = at::cos(randn({16, 4})), sin_cache = at::sin(randn({16, 4}));
  const at::Tensor positions = at::randint(0, 16, {2, 5}, at::kLong);
  for (int interleaved : {0, 1}) {
    SCOPED_TRACE("interleaved " + std::to_string(interleaved));
    expect_matches_ort({"RotaryEmbedding",
                        "com.microsoft",
                        {{"interleaved", Attribute::of_int(interleaved)}, {"num_heads", Attribute::of_int(2)}},
                        {{"x", randn({2, 5, 16})}, {"pos", positions}, {"cos", cos_cache}, {"sin", sin_cache}},
                        {"y"}});
    expect_matches_ort({"RotaryEmbedding",
                        "com.microsoft",
                        {{"interleaved", Attribute::of_int(interleaved)}},
                        {{"x", randn({2, 2, 5, 8})}, {"pos", positions}, {"cos", cos_cache}, {"sin", sin_cache}},
                        {"y"}});
  }
  expect_matches_ort({"RotaryEmbedding",
                      "com.microsoft",
                      {{"num_heads", Attribute::of_int(2)}, {"rotary_embedding_dim", Attribute::of_int(4)}},
                      {{"x", randn({2, 5, 16})},
                       {"pos", positions},
                       {"cos", cos_cache.narrow(1, 0, 2).contiguous()},
                       {"sin", sin_cache.narrow(1, 0, 2).contiguous()}},
                      {"y"}});
}

TEST_F(ContribOps, GroupQueryAttentionPromptDecodeRotaryWindowAndSoftcap) {
  const auto heads = Attribute::of_int(4), kv_heads = Attribute::of_int(2);
  const at::Tensor cos_cache = at::cos(randn({16, 8})), sin_cache = at::sin(randn({16, 8}));
  auto lengths = [](std::vector<int> v) { return at::tensor(v, at::kInt); };
  // Heads of 16 (ONNX Runtime's CPU kernel wants multiples of 16). Prompt: 5 tokens, both sequences full.
  const at::Tensor q = randn({2, 5, 64}), k = randn({2, 5, 32}), v = randn({2, 5, 32});
  const std::vector<std::pair<std::string, at::Tensor>> prompt{{"q", q},
                                                               {"k", k},
                                                               {"v", v},
                                                               {"", {}},
                                                               {"", {}},
                                                               {"seqlens_k", lengths({4, 4})},
                                                               {"total", at::scalar_tensor(5, at::kInt)}};
  expect_matches_ort({"GroupQueryAttention",
                      "com.microsoft",
                      {{"num_heads", heads}, {"kv_num_heads", kv_heads}},
                      prompt,
                      {"y", "present_k", "present_v"}});
  expect_matches_ort({"GroupQueryAttention",
                      "com.microsoft",
                      {{"num_heads", heads},
                       {"kv_num_heads", kv_heads},
                       {"local_window_size", Attribute::of_int(2)},
                       {"softcap", Attribute::of_float(2.0)}},
                      prompt,
                      {"y"}});
  auto rotary = prompt;
  rotary.push_back({"cos", cos_cache});
  rotary.push_back({"sin", sin_cache});
  for (int interleaved : {0, 1})
    expect_matches_ort({"GroupQueryAttention",
                        "com.microsoft",
                        {{"num_heads", heads},
                         {"kv_num_heads", kv_heads},
                         {"do_rotary", Attribute::of_int(1)},
                         {"rotary_interleaved", Attribute::of_int(interleaved)}},
                        rotary,
                        {"y", "present_k", "present_v"}});
  // Decode: one token after a past of 3.
  expect_matches_ort({"GroupQueryAttention",
                      "com.microsoft",
                      {{"num_heads", heads}, {"kv_num_heads", kv_heads}},
                      {{"q", randn({2, 1, 64})},
                       {"k", randn({2, 1, 32})},
                       {"v", randn({2, 1, 32})},
                       {"past_k", randn({2, 2, 3, 16})},
                       {"past_v", randn({2, 2, 3, 16})},
                       {"seqlens_k", lengths({3, 3})},
                       {"total", at::scalar_tensor(4, at::kInt)}},
                      {"y", "present_k", "present_v"}});
}

// ONNX Runtime runs BiasAdd on GPUs only: checked against its definition, X + bias + skip.
TEST(ContribOpsByDefinition, BiasAddIsTheSumOfItsInputs) {
  at::manual_seed(3);
  const at::Tensor x = randn({2, 5, 24}), b = randn({24}), skip = randn({2, 5, 24});
  Graph g = testing::single_node({"BiasAdd", "com.microsoft", {}, {{"x", x}, {"b", b}, {"skip", skip}}, {"y"}});
  Executor ours(g, testing::shipped_registry());
  const at::Tensor y = ours.run({{"x", x}, {"b", b}, {"skip", skip}})[0];
  EXPECT_TRUE(at::allclose(y, x + b.reshape({1, 1, 24}) + skip, 1e-6, 1e-6));
}

TEST_F(ContribOps, Normalizations) {
  const at::Tensor x = randn({2, 7, 32}, 2) + 0.5, skip = randn({2, 7, 32}), gamma = randn({32}), beta = randn({32}),
                   bias = randn({32});
  expect_matches_ort({"SkipLayerNormalization",
                      "com.microsoft",
                      {{"epsilon", Attribute::of_float(1e-5)}},
                      {{"x", x}, {"skip", skip}, {"gamma", gamma}, {"beta", beta}, {"bias", bias}},
                      {"y", "mean", "inv_std", "sum"}});
  expect_matches_ort(
      {"SkipLayerNormalization", "com.microsoft", {}, {{"x", x}, {"skip", skip}, {"gamma", gamma}}, {"y"}});
  expect_matches_ort({"SkipSimplifiedLayerNormalization",
                      "com.microsoft",
                      {{"epsilon", Attribute::of_float(1e-6)}},
                      {{"x", x}, {"skip", skip}, {"gamma", gamma}, {"bias", bias}},
                      {"y", "mean", "inv_std", "sum"}});
  expect_matches_ort({"SimplifiedLayerNormalization",
                      "",
                      {{"epsilon", Attribute::of_float(1e-6)}},
                      {{"x", x}, {"scale", gamma}},
                      {"y", "inv_std"}});
}

TEST_F(ContribOps, FusedConvWithEachActivation) {
  const at::Tensor x = randn({2, 4, 9, 9}), w = randn({6, 4, 3, 3}, 0.3), b = randn({6}), z = randn({2, 6, 9, 9});
  const std::map<std::string, Attribute> pad{{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  for (const auto& [act, params] :
       std::vector<std::pair<std::string, std::vector<double>>>{{"Relu", {}},
                                                                {"Tanh", {}},
                                                                {"Sigmoid", {}},
                                                                {"LeakyRelu", {0.1}},
                                                                {"Clip", {-0.5, 0.7}},
                                                                {"HardSigmoid", {0.3, 0.4}}}) {
    auto attrs = pad;
    attrs["activation"] = Attribute::of_string(act);
    if (!params.empty()) attrs["activation_params"] = Attribute::of_floats(params);
    expect_matches_ort({"FusedConv", "com.microsoft", attrs, {{"x", x}, {"w", w}, {"b", b}}, {"y"}});
  }
  auto with_sum = pad;
  with_sum["activation"] = Attribute::of_string("Relu");
  expect_matches_ort({"FusedConv", "com.microsoft", with_sum, {{"x", x}, {"w", w}, {"b", b}, {"z", z}}, {"y"}});
}

TEST_F(ContribOps, FusedMatMulTransposes) {
  const at::Tensor a = randn({3, 4, 5}), b = randn({3, 5, 6});
  expect_matches_ort(
      {"FusedMatMul", "com.microsoft", {{"alpha", Attribute::of_float(0.125)}}, {{"a", a}, {"b", b}}, {"y"}});
  expect_matches_ort({"FusedMatMul",
                      "com.microsoft",
                      {{"transA", Attribute::of_int(1)}, {"transB", Attribute::of_int(1)}},
                      {{"a", randn({3, 5, 4})}, {"b", randn({3, 6, 5})}},
                      {"y"}});
  expect_matches_ort({"FusedMatMul",
                      "com.microsoft",
                      {{"transB", Attribute::of_int(1)}},
                      {{"a", randn({2, 3, 8})}, {"b", randn({10, 8})}},
                      {"y"}});
  expect_matches_ort({"FusedMatMul",
                      "com.microsoft",
                      {{"transBatchA", Attribute::of_int(1)}},
                      {{"a", randn({4, 3, 5})}, {"b", randn({3, 5, 6})}},
                      {"y"}});
  expect_matches_ort({"FusedMatMul",
                      "com.microsoft",
                      {{"transBatchB", Attribute::of_int(1)}, {"transB", Attribute::of_int(1)}},
                      {{"a", randn({2, 3, 4, 5})}, {"b", randn({6, 2, 3, 5})}},
                      {"y"}});
}

// Quantizes `g` (input "x" [batch, 6, 32], output "y") W8A8 with the shipped ONNX Runtime config
// on random data in batches of 8, exports it, and checks that `weights` constant weights export
// through DequantizeLinear into the fused ops, that ONNX Runtime runs the export to our
// simulation within one output step (its float kernels after DequantizeLinear), and that the
// quantized model stays close to float.
void expect_quantized_block_runs_in_ort(Graph g, int weights, const std::string& what) {
  testing::TempDir dir;
  ValueInfo x = testing::value_of("x");
  x.has_shape = true;
  x.shape = {Dim{-1, "batch"}, Dim{6, ""}, Dim{32, ""}};
  g.inputs.push_back(x);
  ValueInfo y = testing::value_of("y");
  y.has_shape = true;
  y.shape = x.shape;
  g.outputs.push_back(y);
  g.opset_imports[""] = 17;
  g.opset_imports["com.microsoft"] = 1;
  const at::Tensor calib = randn({64, 6, 32}), test = randn({8, 6, 32});
  write_npy(calib, dir / "calib.npy");
  Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
  c.calibration.batch_size = 8;
  QuantModel qm(Model{std::move(g), ModelMeta{}}, c, testing::shipped_registry());
  auto data = open_dataset(dir / "calib.npy", qm.graph().inputs);
  qm.calibrate(*data);
  qm.set_quant(true, true);
  const at::Tensor simulated = qm.forward({test})[0].detach();
  const std::string path = dir / "block_qdq.onnx";
  qm.export_onnx(path);
  const Model exported = load_onnx(path);
  int dequantized_weights = 0;
  for (const Node* n : exported.graph.nodes())
    if (n->domain == "com.microsoft" && n->inputs.size() > 1)
      for (const Node* p : exported.graph.nodes())
        if (p->op_type == "DequantizeLinear" && p->outputs[0] == n->inputs[1] &&
            exported.graph.initializers.count(p->inputs[0]))
          ++dequantized_weights;
  EXPECT_EQ(dequantized_weights, weights) << what;
  write_npy(test, dir / "test.npy");
  const auto r =
      testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + path +
                           " --optimization disabled --in x=" + (dir / "test.npy") + " --out y=" + (dir / "ort.npy"));
  ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
  const at::Tensor ort = read_npy(dir / "ort.npy");
  const double step = 2 * simulated.abs().max().item<double>() / 255;
  EXPECT_LE((ort - simulated).abs().max().item<double>(), step) << what;
  qm.set_quant(false, false);
  const at::Tensor fp = qm.forward({test})[0].detach();
  EXPECT_GT(at::cosine_similarity(fp.reshape({-1}), simulated.reshape({-1}), 0).item<double>(), 0.99) << what;
}

Node ms_node(const std::string& name, const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
             std::map<std::string, Attribute> attributes = {}) {
  Node n = testing::make_node(name, op, std::move(in), std::move(out), std::move(attributes));
  n.domain = "com.microsoft";
  return n;
}

// A BERT layer as ONNX Runtime's optimizer leaves it: Attention with its packed QKV weight, the
// output projection, SkipLayerNormalization, an MLP of FusedMatMul and BiasGelu, and a second
// SkipLayerNormalization.
TEST_F(ContribOps, BertLayerInOptimizedFormQuantizesAndRunsInOnnxRuntime) {
  Graph g;
  g.initializers["w_qkv"] = randn({32, 96}, 0.2);
  g.initializers["b_qkv"] = randn({96}, 0.05);
  g.initializers["w_o"] = randn({32, 32}, 0.2);
  g.initializers["w_up"] = randn({32, 64}, 0.2);
  g.initializers["b_up"] = randn({64}, 0.05);
  g.initializers["w_down"] = randn({64, 32}, 0.15);
  for (const char* n : {"gamma1", "gamma2"}) g.initializers[n] = at::rand({32}) + 0.5;
  for (const char* n : {"beta1", "beta2"}) g.initializers[n] = randn({32}, 0.1);
  g.append(ms_node("attn", "Attention", {"x", "w_qkv", "b_qkv"}, {"ctx"}, {{"num_heads", Attribute::of_int(4)}}));
  g.append(ms_node("proj", "FusedMatMul", {"ctx", "w_o"}, {"o"}));
  g.append(ms_node("ln1", "SkipLayerNormalization", {"o", "x", "gamma1", "beta1"}, {"h"}));
  g.append(ms_node("up", "FusedMatMul", {"h", "w_up"}, {"u"}));
  g.append(ms_node("gelu", "BiasGelu", {"u", "b_up"}, {"a"}));
  g.append(ms_node("down", "FusedMatMul", {"a", "w_down"}, {"d"}, {{"alpha", Attribute::of_float(0.5)}}));
  g.append(ms_node("ln2", "SkipLayerNormalization", {"d", "h", "gamma2", "beta2"}, {"y"}));
  expect_quantized_block_runs_in_ort(std::move(g), 4, "BERT layer");
}

// A decoder layer (Llama's shape) as ONNX Runtime's generative tooling writes it: RMS norms,
// Q/K/V projections, RotaryEmbedding on queries and keys, GroupQueryAttention with two kv heads,
// SkipSimplifiedLayerNormalization, and a QuickGelu MLP.
TEST_F(ContribOps, DecoderLayerInOptimizedFormQuantizesAndRunsInOnnxRuntime) {
  Graph g;
  g.initializers["norm1"] = at::rand({32}) + 0.5;
  g.initializers["norm2"] = at::rand({32}) + 0.5;
  g.initializers["w_q"] = randn({32, 32}, 0.2);
  g.initializers["w_k"] = randn({32, 32}, 0.2);
  g.initializers["w_v"] = randn({32, 32}, 0.2);
  g.initializers["w_o"] = randn({32, 32}, 0.2);
  g.initializers["w_up"] = randn({32, 64}, 0.2);
  g.initializers["w_down"] = randn({64, 32}, 0.15);
  const at::Tensor angles = at::arange(16).to(at::kFloat).unsqueeze(1) * at::rand({1, 8});
  g.initializers["cos"] = at::cos(angles);
  g.initializers["sin"] = at::sin(angles);
  g.initializers["positions"] = at::arange(6, at::kLong).unsqueeze(0).expand({8, 6}).contiguous();
  g.initializers["seqlens_k"] = at::full({8}, 5, at::kInt);
  g.initializers["total"] = at::scalar_tensor(6, at::kInt);
  Node rms = testing::make_node("rms1", "SimplifiedLayerNormalization", {"x", "norm1"}, {"n"},
                                {{"epsilon", Attribute::of_float(1e-6)}});
  g.append(std::move(rms));
  for (const char* p : {"q", "k", "v"})
    g.append(ms_node(std::string("proj_") + p, "FusedMatMul", {"n", std::string("w_") + p}, {std::string(p) + "0"}));
  g.append(ms_node("rot_q", "RotaryEmbedding", {"q0", "positions", "cos", "sin"}, {"q1"},
                   {{"num_heads", Attribute::of_int(2)}}));
  g.append(ms_node("rot_k", "RotaryEmbedding", {"k0", "positions", "cos", "sin"}, {"k1"},
                   {{"num_heads", Attribute::of_int(2)}}));
  g.append(ms_node("gqa", "GroupQueryAttention", {"q1", "k1", "v0", "", "", "seqlens_k", "total"}, {"ctx"},
                   {{"num_heads", Attribute::of_int(2)}, {"kv_num_heads", Attribute::of_int(2)}}));
  g.append(ms_node("proj_o", "FusedMatMul", {"ctx", "w_o"}, {"o"}));
  g.append(ms_node("rms2", "SkipSimplifiedLayerNormalization", {"o", "x", "norm2"}, {"h", "", "", "res"},
                   {{"epsilon", Attribute::of_float(1e-6)}}));
  g.append(ms_node("up", "FusedMatMul", {"h", "w_up"}, {"u"}));
  g.append(ms_node("act", "QuickGelu", {"u"}, {"a"}));
  g.append(ms_node("down", "FusedMatMul", {"a", "w_down"}, {"d"}, {{"alpha", Attribute::of_float(0.5)}}));
  g.append(testing::make_node("residual", "Add", {"d", "res"}, {"y"}));
  expect_quantized_block_runs_in_ort(std::move(g), 6, "decoder layer");
}

}  // namespace
}  // namespace sparsebit
