// Float8 and float16 Q/DQ against ONNX Runtime, bit for bit, and the float8 exports that say how
// ONNX Runtime must load them (the 8- and 4-bit integer cases: test_ort.cpp).

#include "ort_support.h"

namespace sparsebit::ort_tests {
namespace {

// Elements where a and b differ (NaN matching NaN).
std::int64_t mismatches(const at::Tensor& a, const at::Tensor& b) {
  return at::logical_not(at::logical_or(a.eq(b), at::logical_and(at::isnan(a), at::isnan(b))))
      .sum()
      .item<std::int64_t>();
}

// A float8 export of a CNN (configs/fp8_tensorrt.toml) says how ONNX Runtime must load it, and
// that is true: at its default level ONNX Runtime fuses the float8 Q/DQ around a Conv into a
// QLinearConv that takes no float8 and refuses the model; at 'basic' it runs it like the
// simulation (Note [Float8 exports in ONNX Runtime]).
TEST(OnnxRuntime, Float8ExportsSayHowOnnxRuntimeLoadsThem) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
  write_npy(test_images(4), dir / "x.npy");
  const auto q = testing::run_cli("quantize " + testing::fixture_model() + " -c " +
                                  testing::source_path("configs/fp8_tensorrt.toml") + " --calib " + images +
                                  " --calib-count 64 -o " + dir / "fp8.onnx --report " + dir / "r.json --eval-data " +
                                  dir / "x.npy --eval-outputs " + dir / "sim.npy");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("ONNX Runtime loads it only at graph optimization level 'basic'"), std::string::npos)
      << q.output;
  const auto report = nlohmann::json::parse(testing::read_text(dir / "r.json"));
  ASSERT_EQ(report.at("notes").size(), 1u);
  auto run = [&](const std::string& level) {
    return testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " +
                                dir / "fp8.onnx --optimization " + level + " --in image=" + dir / "x.npy" +
                                " --out logits=" + dir / ("ort_" + level + ".npy"));
  };
  EXPECT_NE(run("all").exit_code, 0) << "ONNX Runtime now loads float8 exports at its default level: drop the note";
  const auto basic = run("basic");
  ASSERT_EQ(basic.exit_code, 0) << basic.output;
  // Float sums in another order can round an activation that sits on a tie the other way, one
  // float8 step (1/8 of its value for E4M3): the logits then move by a fraction of that.
  const at::Tensor ort = read_npy(dir / "ort_basic.npy"), sim = read_npy(dir / "sim.npy").reshape_as(ort);
  EXPECT_LT((ort - sim).abs().max().item<double>(), 0.02 * sim.abs().max().item<double>());
  EXPECT_TRUE(at::equal(ort.argmax(1), sim.argmax(1)));
}

// Float8 Q/DQ (opset 19, FLOAT8E4M3FN / FLOAT8E5M2 zero points) against ONNX Runtime's CPU
// kernels, bit for bit: values across and beyond the range, exact ties between neighbouring float8
// values, per tensor and per channel; and our executor running the same model, with and without
// saturation (saturate = 0: NaN or infinity beyond the largest value, the ties at the edge
// included). ORT runs the nodes as written ('basic'): at 'extended' its QDQ fusion turns float8
// Q/DQ around a Conv into a QLinearConv that has no float8 kernel and refuses the model (ONNX
// Runtime 1.30).
TEST(OnnxRuntime, Float8QdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(19);
  for (QElement element : {QElement::kFloat8E4M3FN, QElement::kFloat8E5M2}) {
    const double largest = float8_max(element);
    // Ties: midpoints of neighbouring values, with a power-of-two scale that keeps them exact.
    at::Tensor grid = decode_float8(at::arange(0, 128, at::kInt).to(at::kByte), element);
    grid = grid.masked_select(at::isfinite(grid));
    at::Tensor ties = (grid.slice(0, 0, -1) + grid.slice(0, 1)) / 2;
    // The edge of each format (x 0.25, the per-tensor scale): E4M3FN's tie 464 (to 448), just
    // above and 485 (NaN without saturation), E5M2's tie 61440 (to infinity) and just below (57344).
    const at::Tensor edges =
        at::tensor({464.0f, std::nextafter(464.0f, 1e9f), 485.0f, 61440.0f, std::nextafter(61440.0f, 0.0f)}) * 0.25;
    at::Tensor x = at::cat({at::randn({64 * kChannels * 16}) * at::exp(at::randn({64 * kChannels * 16}) * 3),
                            ties * 0.25, -ties * 0.25, edges, -edges,
                            at::tensor({float(largest) * 0.3f, float(largest) * 1e3f, INFINITY, -INFINITY, NAN})});
    x = at::cat({x, at::zeros({kChannels * 16 - x.numel() % (kChannels * 16)})}).reshape({-1, kChannels, 16});
    for (const Case& c : {Case{"per_tensor", true, false}, Case{"per_channel", true, true}}) {
      QSpec spec;
      spec.element = element;
      spec.per_channel = c.per_channel;
      spec.channel_axis = 1;
      QParams p;
      p.scale = c.per_channel ? at::cat({at::tensor({0.25f}), at::rand({kChannels - 1}) * 0.05 + 0.001})
                              : at::scalar_tensor(0.25f);
      p.zero_point = at::zeros_like(p.scale, at::kInt);
      for (bool saturate : {true, false}) {
        Graph g = qdq_model(p, c, 8);
        g.opset_imports[""] = 19;
        g.initializers["zp"] = at::zeros_like(p.scale, at::kByte);
        g.narrow_types["zp"] = element == QElement::kFloat8E4M3FN ? 17 : 19;
        if (!saturate) g.nodes()[0]->attributes["saturate"] = Attribute::of_int(0);
        const std::string what = element_name(element) + " " + c.name + (saturate ? "" : " saturate=0");
        const std::string path = dir / (element_name(element) + "_" + c.name + (saturate ? "" : "_ns") + ".onnx");
        save_onnx(g, ModelMeta{}, path);
        at::Tensor ort = run_in_ort(path, "x", x, "y", dir, "basic");
        ASSERT_TRUE(ort.defined());
        if (saturate) {
          at::Tensor ours = fake_quantize(x, p, spec);
          EXPECT_EQ(mismatches(ort, ours), 0) << what << " of " << x.numel();
        } else {
          EXPECT_GT(at::isnan(ort).sum().item<std::int64_t>() + at::isinf(ort).sum().item<std::int64_t>(), 2) << what;
        }
        // Our executor reads the model back (float8 zero points held as codes) and runs it.
        const Model reloaded = load_onnx(path);
        Executor executor(reloaded.graph, testing::shipped_registry());
        at::Tensor run = executor.run({{"x", x}})[0];
        at::Tensor expected = ort;
        if (!saturate) {  // ONNX's Cast where ORT differs (Note [Float8 Q/DQ]): by hand
          const at::Tensor scale = c.per_channel ? p.scale.reshape({1, -1, 1}) : p.scale;
          const at::Tensor v = (x / scale).abs(), inf = at::full_like(x, INFINITY).copysign(x);
          expected = element == QElement::kFloat8E4M3FN
                         ? at::where(at::logical_and(v.ge(480), v.lt(496)), at::full_like(x, NAN), ort)
                         : at::where(v.ge(61440), inf, ort);
        }
        EXPECT_EQ(mismatches(expected, run), 0) << what << ", our executor, of " << x.numel();
      }
    }
  }
}

// Opset 21's QuantizeLinear without a zero point: output_dtype gives the output type (int8,
// int16, int4, float8 E4M3/E5M2; zero point 0), and DequantizeLinear reads it without one too.
// ONNX Runtime and our executor agree bit for bit.
TEST(OnnxRuntime, QuantizeLinearOutputDtypeMatchesOnnxRuntime) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(21);
  const at::Tensor x = qdq_input(40.0, 0.25);
  for (std::int64_t type : {3, 5, 22, 17, 19}) {
    QParams p;
    p.scale = at::scalar_tensor(0.25f);
    p.zero_point = at::scalar_tensor(0, at::kInt);
    Graph g = qdq_model(p, Case{"per_tensor", true, false}, 8);
    g.opset_imports[""] = 21;
    g.initializers.erase("zp");
    for (Node* n : g.nodes()) n->inputs.resize(2);
    g.nodes()[0]->attributes["output_dtype"] = Attribute::of_int(type);
    const std::string path = dir / ("output_dtype_" + std::to_string(type) + ".onnx");
    save_onnx(g, ModelMeta{}, path);
    at::Tensor ort = run_in_ort(path, "x", x, "y", dir, "basic");
    ASSERT_TRUE(ort.defined()) << type;
    const Model reloaded = load_onnx(path);
    Executor executor(reloaded.graph, testing::shipped_registry());
    at::Tensor ours = executor.run({{"x", x}})[0];
    EXPECT_EQ(mismatches(ort, ours), 0) << "output_dtype " << type << " of " << x.numel();
    // The grid: int8 saturates at 127 steps, int4 at 7, the float8 types round relatively.
    if (type == 3) EXPECT_EQ(ours.max().item<float>(), 127 * 0.25f);
    if (type == 22) EXPECT_EQ(ours.max().item<float>(), 7 * 0.25f);
  }
}

// A float16 model's Q/DQ (float16 input and scales): DequantizeLinear's output has the scale's
// type, as ONNX defines; int8 and float8 E4M3, bit for bit with ONNX Runtime.
TEST(OnnxRuntime, Float16QdqMatchesOnnxRuntime) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(16);
  const at::Tensor x = qdq_input(20.0, 0.25).to(at::kHalf);
  for (int zero_point_type : {int(onnx::TensorProto::INT8), 17}) {
    QParams p;
    p.scale = at::scalar_tensor(0.1875f);
    p.zero_point = at::scalar_tensor(0, at::kInt);
    Graph g = qdq_model(p, Case{"per_tensor", true, false}, 8);
    g.opset_imports[""] = 19;
    g.inputs[0].elem_type = g.outputs[0].elem_type = onnx::TensorProto::FLOAT16;
    g.initializers["s"] = g.initializers["s"].to(at::kHalf);
    if (zero_point_type == 17) {
      g.initializers["zp"] = at::zeros({}, at::kByte);
      g.narrow_types["zp"] = 17;
    }
    const std::string path = dir / ("float16_" + std::to_string(zero_point_type) + ".onnx");
    save_onnx(g, ModelMeta{}, path);
    at::Tensor ort = run_in_ort(path, "x", x, "y", dir, "basic");
    ASSERT_TRUE(ort.defined());
    ASSERT_EQ(ort.scalar_type(), at::kHalf);
    const Model reloaded = load_onnx(path);
    Executor executor(reloaded.graph, testing::shipped_registry());
    at::Tensor ours = executor.run({{"x", x}})[0];
    ASSERT_EQ(ours.scalar_type(), at::kHalf) << zero_point_type;
    EXPECT_EQ(mismatches(ort.to(at::kFloat), ours.to(at::kFloat)), 0) << "zero point type " << zero_point_type;
  }
}

// The bundled CNN in FP8 for TensorRT (configs/fp8_tensorrt.toml), its first convolution in INT8
// through [[specific]]: the export carries float8 Q/DQ at opset 19 on the products' inputs only,
// int8 Q/DQ on the INT8 layer, and ONNX Runtime runs it ('basic') to the simulated outputs.
TEST(OnnxRuntime, MixedFloat8AndInt8ModelRunsInOnnxRuntime) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  Config c = Config::from_string(
      "backend = \"tensorrt\"\n[w]\ntype = \"fp8_e4m3\"\n[a]\ntype = \"fp8_e4m3\"\nobserver = \"minmax\"\n"
      "[[specific]]\nnodes = [\"/conv1/Conv\"]\nw = { type = \"int\" }\na = { type = \"int\" }\n",
      "fp8.toml");
  auto qm = calibrated_fixture(c, 256);
  const std::string path = dir / "fp8.onnx";
  qm->export_onnx(path);
  onnx::ModelProto proto;
  {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&in));
  }
  EXPECT_EQ(proto.opset_import(0).version(), 19);
  std::map<std::string, int> zp_type;  // zero-point initializer -> ONNX element type
  for (const auto& t : proto.graph().initializer()) zp_type[t.name()] = t.data_type();
  int float8_dq = 0, int8_dq = 0;
  for (const auto& n : proto.graph().node()) {
    if (n.op_type() != "DequantizeLinear") continue;
    const int t = zp_type.at(n.input(2));
    float8_dq += t == 17;  // FLOAT8E4M3FN (ONNX 1.14; the installed headers may predate it)
    int8_dq += t == onnx::TensorProto::INT8;
  }
  EXPECT_EQ(int8_dq, 2) << "conv1's weight and input";
  EXPECT_GT(float8_dq, 4);
  // Only Conv/Gemm/MatMul read float8: every DequantizeLinear feeds one.
  std::map<std::string, std::string> consumer;
  for (const auto& n : proto.graph().node())
    for (const auto& i : n.input()) consumer[i] = n.op_type();
  for (const auto& n : proto.graph().node())
    if (n.op_type() == "DequantizeLinear") {
      const std::string op = consumer[n.output(0)];
      EXPECT_TRUE(op == "Conv" || op == "Gemm" || op == "MatMul") << n.name() << " feeds " << op;
    }
  at::Tensor x = test_images(64);
  qm->set_quant(true, true);
  at::Tensor simulated = qm->forward({x})[0].detach();
  at::Tensor ort = run_in_ort(path, "image", x, "logits", dir, "basic");
  ASSERT_TRUE(ort.defined());
  // ORT's float convolutions round differently from LibTorch's; where a value sits at a float8
  // rounding edge the two land one float8 step (1/16 relative) apart, and that travels.
  const double rel = ((ort - simulated).abs().max() / simulated.abs().max()).item<double>();
  EXPECT_LT(rel, 0.05);
  EXPECT_GE(ort.argmax(1).eq(simulated.argmax(1)).to(at::kFloat).mean().item<double>(), 0.95);
  // Our executor reads the export back (float8 weights and zero points held as their codes) and
  // computes what the simulation does.
  const Model exported = load_onnx(path);
  Executor ours(exported.graph, testing::shipped_registry());
  at::Tensor reread = ours.run({{"image", x}})[0];
  EXPECT_TRUE(at::allclose(reread, simulated, 1e-5, 1e-5)) << (reread - simulated).abs().max().item<float>();
}

}  // namespace
}  // namespace sparsebit::ort_tests
