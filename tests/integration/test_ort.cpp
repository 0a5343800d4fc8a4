// 8-bit Q/DQ agreement with ONNX Runtime: our quantize_to_int / fake_quantize against ORT's
// QuantizeLinear / DequantizeLinear kernels on the same data, bit for bit.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/quant.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  bool symmetric;
  bool per_channel;
};

constexpr std::int64_t kChannels = 8;

// Random values across and beyond the range, plus exact ties (k + 0.5) * tie_scale.
at::Tensor qdq_input(double spread, double tie_scale) {
  return at::cat({at::randn({64, kChannels, 16}) * spread,
                  ((at::arange(-1024, 1024).to(at::kFloat) + 0.5) * tie_scale).reshape({16, kChannels, 16})},
                 0)
      .contiguous();
}

// x [N, kChannels, L] -> QuantizeLinear -> DequantizeLinear -> y (4-bit: int4/uint4 zero point).
Graph qdq_model(const QParams& p, const Case& c, int bits) {
  Graph g;
  g.opset_imports[""] = bits == 4 ? 21 : 13;
  const std::vector<Dim> shape{{-1, ""}, {kChannels, ""}, {-1, ""}};
  g.inputs.push_back({"x", 1, true, shape, ""});
  g.outputs.push_back({"y", 1, true, shape, ""});
  g.initializers["s"] = p.scale.to(at::kFloat);
  g.initializers["zp"] = p.zero_point.to(c.symmetric ? at::kChar : at::kByte);
  if (bits == 4) g.narrow_types["zp"] = c.symmetric ? 22 : 21;
  Node q, dq;
  q.name = "q";
  q.op_type = "QuantizeLinear";
  q.inputs = {"x", "s", "zp"};
  q.outputs = {"q"};
  dq.name = "dq";
  dq.op_type = "DequantizeLinear";
  dq.inputs = {"q", "s", "zp"};
  dq.outputs = {"y"};
  if (c.per_channel) {
    q.attributes["axis"] = Attribute::of_int(1);
    dq.attributes["axis"] = Attribute::of_int(1);
  }
  g.append(q);
  g.append(dq);
  return g;
}

// Runs `model` in ONNX Runtime on `x` (input `in`), returns output `out`.
at::Tensor run_in_ort(const std::string& model, const std::string& in, const at::Tensor& x, const std::string& out,
                      const testing::TempDir& dir, const std::string& level = "all") {
  write_npy(x, dir / "ort_in.npy");
  auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + model +
                                " --optimization " + level + " --in " + in + "=" + (dir / "ort_in.npy") + " --out " +
                                out + "=" + (dir / "ort_out.npy"));
  EXPECT_EQ(r.exit_code, 0) << model << "\n" << r.output;
  return r.exit_code == 0 ? read_npy(dir / "ort_out.npy") : at::Tensor();
}

// The bundled model calibrated under `c` on the first `count` training images.
std::unique_ptr<QuantModel> calibrated_fixture(Config c, int count) {
  c.calibration.count = count;
  auto qm = std::make_unique<QuantModel>(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm->graph().inputs);
  qm->calibrate(*data);
  return qm;
}

at::Tensor test_images(std::int64_t n) {
  return read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", n)
      .to(at::kFloat)
      .div(255)
      .unsqueeze(1);
}

// Exports `qm`, then checks our executor reproduces the simulation exactly and ONNX Runtime's
// reference kernels (no fusion, which would round float biases its own way) within `steps`
// output steps; returns the exported model.
Model check_export(QuantModel& qm, const std::string& path, const testing::TempDir& dir, double steps,
                   const std::string& what) {
  qm.export_onnx(path);
  Model exported = load_onnx(path);
  at::Tensor x = test_images(32);
  qm.set_quant(true, true);
  at::Tensor simulated = qm.forward({x})[0].detach();
  Executor ours(exported.graph, testing::shipped_registry());
  EXPECT_TRUE(at::allclose(ours.run({{"image", x}})[0], simulated, 1e-5, 1e-5)) << what;
  at::Tensor ort = run_in_ort(path, "image", x, "logits", dir, "disabled");
  if (ort.defined()) {
    const double step = 2 * simulated.abs().max().item<double>() / 255;
    EXPECT_LE((ort - simulated).abs().max().item<double>(), steps * step) << what;
  }
  return exported;
}

// Q/DQ arithmetic against ONNX Runtime's kernels, bit for bit: 8-bit at opset 13 and 4-bit
// (int4 / uint4 zero points) at opset 21, per tensor and per channel, exact ties included.
void expect_qdq_matches_ort(int bits) {
  testing::TempDir dir;
  at::manual_seed(bits == 8 ? 7 : 8);
  const double tie = bits == 8 ? 0.015625 : 0.0625;  // a power of two keeps the ties exact
  at::Tensor x = qdq_input(bits == 8 ? 2.0 : 0.5, tie);
  const std::string prefix = bits == 8 ? "int8" : "int4";
  for (const Case& c :
       {Case{"symmetric", true, false}, Case{"affine", false, false}, Case{"per_channel", true, true}}) {
    QSpec spec;
    spec.bits = bits;
    spec.symmetric = c.symmetric;
    spec.per_channel = c.per_channel;
    spec.channel_axis = 1;
    QParams p;
    if (c.per_channel) {
      p.scale = at::rand({kChannels}) * (bits == 8 ? 0.03 : 0.2) + 0.005;
      p.scale[0] = tie;
      p.zero_point = at::zeros({kChannels}, at::TensorOptions().dtype(at::kInt));
    } else {
      p.scale = at::scalar_tensor(c.symmetric ? tie : (bits == 8 ? 0.0173 : 0.173), at::kFloat);
      p.zero_point = at::scalar_tensor(c.symmetric ? 0 : (bits == 8 ? 131 : 6), at::TensorOptions().dtype(at::kInt));
    }
    const std::string path = dir / (prefix + "_" + c.name + ".onnx");
    save_onnx(qdq_model(p, c, bits), ModelMeta{}, path);
    at::Tensor ort = run_in_ort(path, "x", x, "y", dir);
    at::Tensor ours = fake_quantize(x, p, spec);
    ASSERT_TRUE(ort.defined());
    EXPECT_TRUE(at::equal(ort, ours)) << prefix << " " << c.name << ": max diff "
                                      << (ort - ours).abs().max().item<float>();
    // Our executor runs the same model (4-bit zero points held widened, Graph::narrow_types).
    Model reloaded = load_onnx(path);
    Executor executor(reloaded.graph, testing::shipped_registry());
    EXPECT_TRUE(at::equal(executor.run({{"x", x}})[0], ours)) << prefix << " " << c.name;
  }
}

TEST(OnnxRuntime, EightBitQdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  expect_qdq_matches_ort(8);
}

TEST(OnnxRuntime, FourBitQdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  expect_qdq_matches_ort(4);
}

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

// An opset-9 model (old BatchNormalization, Clip attributes, 2-D Softmax) is lifted to opset 13,
// quantized with per-channel weights, exported, and ONNX Runtime runs it to our simulated outputs:
// its fused integer kernels with reduce-range weights (which cannot saturate on any x86
// processor, Note [u8s8 saturation]), and the Q/DQ nodes as written ('basic') for TensorRT's rules.
TEST(OnnxRuntime, OldOpsetModelIsLiftedQuantizedAndRunsInOnnxRuntime) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  fs::create_directories(dir.path() / "calib");
  at::manual_seed(11);
  for (int i = 0; i < 4; ++i) write_npy(at::rand({8, 3, 16, 16}), dir / ("calib/b" + std::to_string(i) + ".npy"));
  at::Tensor x = at::rand({32, 3, 16, 16});
  for (const char* cfg : {"w8a8_tensorrt.toml", "w8a8_onnxruntime_reduce_range.toml"}) {
    Model m = load_onnx(testing::source_path("tests/fixtures/opset9_cnn.onnx"));
    EXPECT_EQ(m.meta.source_opset, 9);
    QuantModel qm(std::move(m), Config::from_file(testing::source_path(std::string("configs/") + cfg)),
                  testing::shipped_registry());
    auto data = open_dataset((dir.path() / "calib").string(), qm.graph().inputs);
    qm.calibrate(*data);
    qm.export_onnx(dir / "q.onnx");
    EXPECT_EQ(load_onnx(dir / "q.onnx").graph.default_opset(), 13);
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0];
    const bool ort_rules = std::string(cfg) != "w8a8_tensorrt.toml";
    at::Tensor ort = run_in_ort(dir / "q.onnx", "x", x, "probs", dir, ort_rules ? "all" : "basic");
    ASSERT_TRUE(ort.defined()) << cfg;
    // The onnxruntime backend simulates the int32 bias QLinearConv adds; the tensorrt backend's
    // float bias is computed in float by ORT's reference path.
    const double tolerance = ort_rules ? 1e-5 : 1e-3;
    EXPECT_TRUE(at::allclose(ort, simulated, 0, tolerance))
        << cfg << ": max diff " << (ort - simulated).abs().max().item<float>();
  }
}

// Below 8 bits (Note [Narrow export]): the exported graph clips the 8-bit integers to the
// narrower grid and records the widths in metadata.
TEST(OnnxRuntime, NarrowBitExportReproducesTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (auto [wbits, abits] : {std::pair{4, 6}, std::pair{3, 5}}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.w.bits = wbits;
    c.a.bits = abits;
    auto qm = calibrated_fixture(c, 128);
    const std::string what = "W" + std::to_string(wbits) + "A" + std::to_string(abits);
    Model exported = check_export(*qm, dir / (what + ".onnx"), dir, 1.0, what);
    auto bits = nlohmann::json::parse(exported.meta.metadata_props.at("sparsebit.bits"));
    EXPECT_EQ(bits.at("image"), abits);
    EXPECT_EQ(bits.at("fc2.weight"), wbits);
    int clips = 0, quantizes = 0;
    for (const Node* n : exported.graph.nodes()) {
      clips += n->op_type == "Clip" && n->inputs[0].find("_quantized") != std::string::npos;
      quantizes += n->op_type == "QuantizeLinear";
    }
    EXPECT_EQ(clips, quantizes) << what;  // every activation Q/DQ pair is clipped to the narrow grid
  }
}

// Note [4-bit export]: 4-bit weights become int4 initializers behind DequantizeLinear at opset
// 21, and ONNX Runtime loads and runs the model at every optimization level.
TEST(OnnxRuntime, FourBitWeightsExportAsInt4AtOpset21) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (int abits : {8, 4}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.w.bits = 4;
    c.a.bits = abits;
    auto qm = calibrated_fixture(c, 128);
    const std::string path = dir / ("w4a" + std::to_string(abits) + ".onnx");
    Model exported = check_export(*qm, path, dir, 2.0, "W4A" + std::to_string(abits));
    EXPECT_EQ(exported.graph.default_opset(), 21);
    int int4 = 0;
    for (const auto& [name, type] : exported.graph.narrow_types) int4 += type == 22;
    EXPECT_EQ(int4, 7 * 2);  // 7 weights: the packed values and their zero points
    EXPECT_TRUE(run_in_ort(path, "image", test_images(4), "logits", dir, "all").defined());
  }
}

// AdaRound's learnt rounding and QAT's trained weights and scales are what the exported model
// computes: our executor on the export equals the simulation, ONNX Runtime is within 2 steps.
TEST(OnnxRuntime, AdaRoundAndQatExportsReproduceTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  Config ada = Config::from_file(testing::source_path("configs/w4a8_adaround.toml"));
  ada.w.quantizer_options.set("iterations", std::int64_t{50});
  auto qm = calibrated_fixture(ada, 128);
  check_export(*qm, dir / "adaround.onnx", dir, 2.0, "W4A8 AdaRound");
  for (const char* cfg : {"configs/w4a4_lsq.toml", "configs/w4a4_lsq_plus.toml"}) {
    Config c = Config::from_file(testing::source_path(cfg));
    c.calibration.count = 128;
    c.qat.count = 128;
    QuantModel student(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
    auto calib = open_dataset(images, student.graph().inputs);
    student.init_qat(*calib);
    Model float_model = load_onnx(testing::fixture_model());
    Executor teacher(float_model.graph, testing::shipped_registry());
    distill(student, teacher, [&] { return open_dataset(images, student.graph().inputs); }, {c.qat, "", ""});
    check_export(student, dir / "qat.onnx", dir, 2.0, cfg);
  }
}

// Per-group weights (Note [Per-group quantization]) export as blocked DequantizeLinear at opset 21.
TEST(OnnxRuntime, PerGroupWeightsExportAsBlockedDequantizeLinear) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (int bits : {8, 4}) {
    Config c =
        Config::from_string("backend = \"virtual\"\n[w]\nqscheme = \"per-group-symmetric\"\ngroup_size = 16\nbits = " +
                                std::to_string(bits) + "\n",
                            "group.toml");
    auto qm = calibrated_fixture(c, 64);
    // Float accumulation order differs between LibTorch and ONNX Runtime, which can flip an
    // intermediate rounding: allow two output steps (our executor must match exactly).
    Model exported = check_export(*qm, dir / "group.onnx", dir, 2.0, "per-group W" + std::to_string(bits));
    EXPECT_EQ(exported.graph.default_opset(), 21);
    const Node* fc1_dq = nullptr;
    for (const Node* n : exported.graph.nodes())
      if (n->op_type == "DequantizeLinear" && n->inputs[0].rfind("fc1.weight", 0) == 0) fc1_dq = n;
    ASSERT_TRUE(fc1_dq);
    EXPECT_EQ(fc1_dq->attr_int("block_size", 0), 16);
    EXPECT_EQ(exported.graph.initializers.at(fc1_dq->inputs[1]).sizes(),
              (std::vector<std::int64_t>{128, 36}));  // 576 / 16
  }
}

// 16-bit activations: int16 (symmetric) and uint16 (affine) Q/DQ at opset 21.
TEST(OnnxRuntime, SixteenBitActivationsExportAtOpset21) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (const char* scheme : {"per-tensor-symmetric", "per-tensor-affine"}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.a.bits = 16;
    c.a.qscheme = scheme;
    auto qm = calibrated_fixture(c, 64);
    // 16 bits: ORT must agree to a small fraction of an 8-bit output step (float noise only).
    Model exported = check_export(*qm, dir / "a16.onnx", dir, 0.04, scheme);
    EXPECT_EQ(exported.graph.default_opset(), 21);
  }
}

// The accuracy target's remedies export as they simulate and run in ONNX Runtime: int16
// layers as int16 Q/DQ at opset 21 beside 8-bit ones, float layers with no Q/DQ at all, layers
// on another range as 8-bit Q/DQ.
TEST(OnnxRuntime, TargetFallbackLayersExportAndMatchTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (const char* precision : {"int16", "float", "range"}) {
    const bool range = std::string(precision) == "range";
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    // Calibrated on minmax ranges, which the range remedy's candidates improve on (on its auto
    // ranges, with the grids tied around its MaxPools, no layer of this fixture gains by one).
    if (range) c.a.observer = "minmax";
    auto qm = calibrated_fixture(c, 128);
    TargetData data;
    const auto& inputs = qm->graph().inputs;
    const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
    data.calibration = images;
    SampleWindow held(open_dataset(images, inputs), inputs, 2000, 8);
    Batcher one(held, inputs, 1, 0);
    while (auto b = one.next()) data.holdout.push_back(b->inputs);
    data.range_observer = testing::shipped_registry().observer("auto")->factory;
    TargetConfig t;
    t.parse_expression("sqnr>=200", "test");  // out of reach: the whole budget is used
    t.fallback = {precision};
    t.max_fallback_layers = 3;
    TargetReport r = meet_target(*qm, t, data);
    if (range)  // costs nothing: every layer that a range helps takes one
      ASSERT_FALSE(r.fallback_layers.empty());
    else ASSERT_EQ(r.fallback_layers.size(), 3u) << precision;
    EXPECT_EQ(r.precision, precision);
    if (range) EXPECT_GE(r.after, r.before);
    else EXPECT_GT(r.after, r.before) << precision;
    Model exported = check_export(*qm, dir / (std::string(precision) + ".onnx"), dir, 1.0, precision);
    std::set<std::string> moved;
    for (const auto& l : r.fallback_layers) moved.insert(l.node);
    int wide = 0, into_moved = 0;
    std::map<std::string, const Node*> producer;
    for (const Node* n : exported.graph.nodes())
      for (const auto& o : n->outputs) producer[o] = n;
    for (const Node* n : exported.graph.nodes()) {
      if (n->op_type == "QuantizeLinear")
        wide += exported.graph.initializers.at(n->inputs[2]).scalar_type() == at::kShort ||
                exported.graph.narrow_types.count(n->inputs[2]) != 0;
      if (!moved.count(n->name)) continue;
      for (const auto& in : n->inputs) {
        auto p = producer.find(in);
        into_moved += p != producer.end() && p->second->op_type == "DequantizeLinear";
      }
    }
    if (std::string(precision) == "int16") {
      EXPECT_EQ(exported.graph.default_opset(), 21);
      EXPECT_GE(wide, 3);
      EXPECT_GE(into_moved, 3);  // still quantized, on 16 bits
    } else if (range) {
      EXPECT_EQ(wide, 0);
      EXPECT_GE(into_moved, 1);  // still quantized, on 8 bits
    } else {
      EXPECT_EQ(wide, 0);
      EXPECT_EQ(into_moved, 0);  // no Q/DQ in front of a float layer
    }
  }
}

}  // namespace
}  // namespace sparsebit

namespace sparsebit {
namespace {

// A float model whose weights live in a side file goes through `sparsebit quantize
// --external-data`; the QDQ export keeps its weights outside too, loads back to the same
// tensors, and runs in ONNX Runtime with the same outputs as the in-file export.
TEST(OnnxRuntime, ExternalDataRoundTripsThroughQuantize) {
  testing::TempDir dir;
  Model m = load_onnx(testing::fixture_model());
  ExportOptions ext;
  ext.external_data = true;
  save_onnx(m.graph, m.meta, dir / "float.onnx", ext);
  ASSERT_TRUE(std::filesystem::exists(dir / "float.onnx.data"));
  EXPECT_LT(std::filesystem::file_size(dir / "float.onnx"), std::filesystem::file_size(dir / "float.onnx.data"));
  Model back = load_onnx(dir / "float.onnx");
  for (const auto& [name, t] : m.graph.initializers)
    EXPECT_TRUE(at::equal(back.graph.initializers.at(name), t)) << name;

  const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
  // Two runs compared bit for bit: the static placement (the latency search follows the timings).
  const std::string common = " -c " + testing::source_path("configs/w8a8_onnxruntime.toml") + " --calib " + images +
                             " --calib-count 64 --no-latency";
  auto r = testing::run_cli("quantize " + (dir / "float.onnx") + common + " -o " + (dir / "q_ext.onnx") +
                            " --external-data");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(dir / "q_ext.onnx.data"));
  r = testing::run_cli("quantize " + (dir / "float.onnx") + common + " -o " + (dir / "q_in.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "q_in.onnx.data")) << "small models stay in one file by default";

  const at::Tensor x = test_images(16);
  at::Tensor with_side_file = run_in_ort(dir / "q_ext.onnx", "image", x, "logits", dir);
  at::Tensor in_file = run_in_ort(dir / "q_in.onnx", "image", x, "logits", dir);
  ASSERT_TRUE(with_side_file.defined() && in_file.defined());
  EXPECT_TRUE(at::equal(with_side_file, in_file));
}

// Channel-pruned models (both Fashion-MNIST fixtures, 30% and 50%) run in ONNX Runtime and
// compute what the masked models compute; pruned then W8A8-quantized, ORT reproduces the
// simulation.
TEST(OnnxRuntime, PrunedModelsMatchTheMaskedModelsAndQuantize) {
  testing::TempDir dir;
  at::Tensor x = test_images(16);
  for (const char* name : {"fashion_mnist_cnn", "fashion_mnist_mobilenet"}) {
    Model model = load_onnx(testing::source_path(std::string("examples/fashion_mnist/") + name + ".onnx"));
    for (double ratio : {0.3, 0.5}) {
      Config c = Config::from_string("[sparse]\nsparser = \"l1_structured\"\nratio = " + std::to_string(ratio) + "\n",
                                     "p.toml");
      c.plugins.use_environment = false;
      PruneResult r = prune(model, c, testing::shipped_registry(), sample_inputs(model.graph));
      EXPECT_GT(r.channels_removed, 0);
      save_onnx(r.pruned.graph, r.pruned.meta, dir / "pruned.onnx");
      save_onnx(r.masked.graph, r.masked.meta, dir / "masked.onnx");
      at::Tensor p = run_in_ort(dir / "pruned.onnx", "image", x, "logits", dir);
      at::Tensor m = run_in_ort(dir / "masked.onnx", "image", x, "logits", dir);
      ASSERT_TRUE(p.defined() && m.defined());
      EXPECT_LE((p - m).abs().max().item<double>(), 1e-5 * m.abs().max().item<double>()) << name << " " << ratio;
    }
  }
  Config c = Config::from_file(testing::source_path("configs/prune_channels_30_w8a8_onnxruntime.toml"));
  c.plugins.use_environment = false;
  Model model = load_onnx(testing::fixture_model());
  PruneResult r = prune(model, c, testing::shipped_registry(), sample_inputs(model.graph));
  c.calibration.count = 256;
  QuantModel qm(std::move(r.pruned), c, testing::shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
  qm.calibrate(*data);
  check_export(qm, dir / "pruned_qdq.onnx", dir, 2, "pruned W8A8");
}

}  // namespace
}  // namespace sparsebit
