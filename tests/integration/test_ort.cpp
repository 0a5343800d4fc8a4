// 8-bit Q/DQ agreement with ONNX Runtime: our quantize_to_int / fake_quantize against ORT's
// QuantizeLinear / DequantizeLinear kernels on the same data, bit for bit.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"
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

TEST(OnnxRuntime, EightBitQdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(7);
  const std::int64_t channels = 8;
  // Random values across and beyond the range, plus exact ties (k + 0.5) * scale.
  at::Tensor x = at::cat({at::randn({64, channels, 16}) * 2.0,
               ((at::arange(-1024, 1024).to(at::kFloat) + 0.5) * 0.015625).reshape({16, channels, 16})},
              0)
          .contiguous();
  write_npy(x, dir / "x.npy");
  for (const Case& c : {Case{"int8_symmetric", true, false}, Case{"uint8_affine", false, false},
                        Case{"int8_per_channel", true, true}}) {
    QSpec spec;
    spec.symmetric = c.symmetric;
    spec.per_channel = c.per_channel;
    spec.channel_axis = 1;
    QParams p;
    if (c.per_channel) {
      p.scale = at::rand({channels}) * 0.03 + 0.001;
      p.scale[0] = 0.015625;  // a power of two keeps the ties exact
      p.zero_point = at::zeros({channels}, at::TensorOptions().dtype(at::kInt));
    } else {
      p.scale = at::scalar_tensor(c.symmetric ? 0.015625 : 0.0173, at::kFloat);
      p.zero_point = at::scalar_tensor(c.symmetric ? 0 : 131, at::TensorOptions().dtype(at::kInt));
    }
    const at::ScalarType qt = c.symmetric ? at::kChar : at::kByte;
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs.push_back({"x", 1, true, {{-1, ""}, {channels, ""}, {-1, ""}}, ""});
    g.outputs.push_back({"q", c.symmetric ? 3 : 2, true, {{-1, ""}, {channels, ""}, {-1, ""}}, ""});
    g.outputs.push_back({"y", 1, true, {{-1, ""}, {channels, ""}, {-1, ""}}, ""});
    g.initializers["s"] = p.scale.to(at::kFloat);
    g.initializers["zp"] = p.zero_point.to(qt);
    Node qn;
    qn.name = "q";
    qn.op_type = "QuantizeLinear";
    qn.inputs = {"x", "s", "zp"};
    qn.outputs = {"q"};
    Node dqn;
    dqn.name = "dq";
    dqn.op_type = "DequantizeLinear";
    dqn.inputs = {"q", "s", "zp"};
    dqn.outputs = {"y"};
    if (c.per_channel) {
      qn.attributes["axis"] = Attribute::of_int(1);
      dqn.attributes["axis"] = Attribute::of_int(1);
    }
    g.append(qn);
    g.append(dqn);
    ModelMeta meta;
    save_onnx(g, meta, dir / (std::string(c.name) + ".onnx"));
    auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " +
                                  (dir / (std::string(c.name) + ".onnx")) + " --in x=" + (dir / "x.npy") +
                                  " --out q=" + (dir / "q.npy") + " --out y=" + (dir / "y.npy"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    at::Tensor ort_q = read_npy(dir / "q.npy");
    at::Tensor ort_y = read_npy(dir / "y.npy");
    at::Tensor our_q = quantize_to_int(x, p, spec).to(qt);
    at::Tensor our_y = fake_quantize(x, p, spec);
    EXPECT_TRUE(at::equal(ort_q, our_q)) << c.name << ": " << (ort_q.to(at::kInt) != our_q.to(at::kInt)).sum().item<int>()
                                         << " integers differ";
    EXPECT_TRUE(at::equal(ort_y, our_y)) << c.name << ": max diff " << (ort_y - our_y).abs().max().item<float>();
  }
}

// 4-bit Q/DQ (opset 21 int4 / uint4 zero points): our fake quantization equals ONNX Runtime's
// QuantizeLinear -> DequantizeLinear bit for bit, per tensor and per channel.
TEST(OnnxRuntime, FourBitQdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(8);
  const std::int64_t channels = 8;
  at::Tensor x = at::cat({at::randn({64, channels, 16}) * 0.5,
                          ((at::arange(-1024, 1024).to(at::kFloat) + 0.5) * 0.0625).reshape({16, channels, 16})},
                         0)
                     .contiguous();
  write_npy(x, dir / "x.npy");
  for (const Case& c : {Case{"int4_symmetric", true, false}, Case{"uint4_affine", false, false},
                        Case{"int4_per_channel", true, true}}) {
    QSpec spec;
    spec.bits = 4;
    spec.symmetric = c.symmetric;
    spec.per_channel = c.per_channel;
    spec.channel_axis = 1;
    QParams p;
    if (c.per_channel) {
      p.scale = at::rand({channels}) * 0.2 + 0.01;
      p.scale[0] = 0.0625;
      p.zero_point = at::zeros({channels}, at::TensorOptions().dtype(at::kInt));
    } else {
      p.scale = at::scalar_tensor(c.symmetric ? 0.0625 : 0.173, at::kFloat);
      p.zero_point = at::scalar_tensor(c.symmetric ? 0 : 6, at::TensorOptions().dtype(at::kInt));
    }
    Graph g;
    g.opset_imports[""] = 21;
    g.inputs.push_back({"x", 1, true, {{-1, ""}, {channels, ""}, {-1, ""}}, ""});
    g.outputs.push_back({"y", 1, true, {{-1, ""}, {channels, ""}, {-1, ""}}, ""});
    g.initializers["s"] = p.scale.to(at::kFloat);
    g.initializers["zp"] = p.zero_point.to(c.symmetric ? at::kChar : at::kByte);
    g.narrow_types["zp"] = c.symmetric ? 22 : 21;
    Node qn, dqn;
    qn.name = "q";
    qn.op_type = "QuantizeLinear";
    qn.inputs = {"x", "s", "zp"};
    qn.outputs = {"q"};
    dqn.name = "dq";
    dqn.op_type = "DequantizeLinear";
    dqn.inputs = {"q", "s", "zp"};
    dqn.outputs = {"y"};
    if (c.per_channel) {
      qn.attributes["axis"] = Attribute::of_int(1);
      dqn.attributes["axis"] = Attribute::of_int(1);
    }
    g.append(qn);
    g.append(dqn);
    const std::string path = dir / (std::string(c.name) + ".onnx");
    save_onnx(g, ModelMeta{}, path);
    auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + path +
                                  " --in x=" + (dir / "x.npy") + " --out y=" + (dir / "y.npy"));
    ASSERT_EQ(r.exit_code, 0) << c.name << "\n" << r.output;
    at::Tensor ort_y = read_npy(dir / "y.npy");
    at::Tensor our_y = fake_quantize(x, p, spec);
    EXPECT_TRUE(at::equal(ort_y, our_y)) << c.name << ": max diff " << (ort_y - our_y).abs().max().item<float>();
    // Our executor runs the same int4 model (zero points held widened, Graph::narrow_types).
    Model reloaded = load_onnx(path);
    Executor ours(reloaded.graph, testing::shipped_registry());
    EXPECT_TRUE(at::equal(ours.run({{"x", x}})[0], our_y)) << c.name;
  }
}

// An opset-9 model (old BatchNormalization, Clip attributes, 2-D Softmax) is lifted to opset 13,
// quantized with per-channel weights, exported, and ONNX Runtime runs it to our simulated outputs.
TEST(OnnxRuntime, OldOpsetModelIsLiftedQuantizedAndRunsInOnnxRuntime) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  fs::create_directories(dir.path() / "calib");
  at::manual_seed(11);
  for (int i = 0; i < 4; ++i) write_npy(at::rand({8, 3, 16, 16}), dir / ("calib/b" + std::to_string(i) + ".npy"));
  at::Tensor x = at::rand({32, 3, 16, 16});
  write_npy(x, dir / "x.npy");
  for (const char* cfg : {"w8a8_tensorrt.toml", "w8a8_onnxruntime.toml"}) {
    Model m = load_onnx(testing::source_path("tests/fixtures/opset9_cnn.onnx"));
    EXPECT_EQ(m.meta.source_opset, 9);
    QuantModel qm(std::move(m), Config::from_file(testing::source_path(std::string("configs/") + cfg)),
                  testing::shipped_registry());
    auto data = open_dataset((dir.path() / "calib").string(), qm.graph().inputs);
    qm.calibrate(*data);
    qm.export_onnx(dir / "q.onnx");
    EXPECT_EQ(load_onnx(dir / "q.onnx").graph.default_opset(), 13);
    auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " +
                                  (dir / "q.onnx") + " --in x=" + (dir / "x.npy") + " --out probs=" + (dir / "y.npy"));
    ASSERT_EQ(r.exit_code, 0) << cfg << "\n" << r.output;
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0];
    at::Tensor ort = read_npy(dir / "y.npy");
    // ONNX Runtime's QLinearConv rounds a float bias to int32 itself; the onnxruntime backend
    // simulates exactly that, the tensorrt backend (float bias) differs by that rounding.
    const double tolerance = std::string(cfg) == "w8a8_onnxruntime.toml" ? 1e-5 : 1e-3;
    EXPECT_TRUE(at::allclose(ort, simulated, 0, tolerance)) << cfg << ": max diff "
                                                            << (ort - simulated).abs().max().item<float>();
  }
}

// Below 8 bits (Note [Narrow export]): the exported graph clips the 8-bit integers to the
// narrower grid, records the widths in metadata, and both our executor and ONNX Runtime's
// reference kernels (no fusion, which would round float biases its own way) reproduce the
// simulation.
TEST(OnnxRuntime, NarrowBitExportReproducesTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (auto [wbits, abits] : {std::pair{4, 6}, std::pair{3, 5}}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.w.bits = wbits;
    c.a.bits = abits;
    c.calibration.count = 128;
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
    qm.calibrate(*data);
    const std::string path = dir / ("w" + std::to_string(wbits) + "a" + std::to_string(abits) + ".onnx");
    {
      std::ofstream out(path, std::ios::binary);
      out << qm.serialize();
    }
    Model exported = load_onnx(path);
    auto bits = nlohmann::json::parse(exported.meta.metadata_props.at("sparsebit.bits"));
    EXPECT_EQ(bits.at("image"), abits);
    EXPECT_EQ(bits.at("fc2.weight"), wbits);
    int clips = 0;
    for (const Node* n : exported.graph.nodes()) clips += n->op_type == "Clip" && n->inputs[0].find("_quantized") != std::string::npos;
    int quantizes = 0;
    for (const Node* n : exported.graph.nodes()) quantizes += n->op_type == "QuantizeLinear";
    EXPECT_EQ(clips, quantizes);  // every activation Q/DQ pair is clipped to the narrow grid

    at::Tensor x = read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 64).to(at::kFloat).div(255).unsqueeze(1);
    write_npy(x, dir / "x.npy");
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0].detach();
    Executor ours(exported.graph, testing::shipped_registry());
    EXPECT_TRUE(at::allclose(ours.run({{"image", x}})[0], simulated, 1e-5, 1e-5)) << wbits << "/" << abits;
    auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + path +
                                  " --optimization disabled --in image=" + (dir / "x.npy") + " --out logits=" + (dir / "y.npy"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    at::Tensor ort = read_npy(dir / "y.npy");
    const double step = 2 * simulated.abs().max().item<double>() / 255;
    EXPECT_LE((ort - simulated).abs().max().item<double>(), step) << "W" << wbits << "A" << abits;
  }
}

// Note [4-bit export]: 4-bit weights become int4 initializers behind DequantizeLinear at opset
// 21; the model re-imports (int4 unpacked) and runs in our executor and in ONNX Runtime at every
// optimization level, its reference kernels reproducing the simulation.
TEST(OnnxRuntime, FourBitWeightsExportAsInt4AtOpset21) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (int abits : {8, 4}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.w.bits = 4;
    c.a.bits = abits;
    c.calibration.count = 128;
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
    qm.calibrate(*data);
    const std::string path = dir / ("w4a" + std::to_string(abits) + ".onnx");
    qm.export_onnx(path);
    Model exported = load_onnx(path);
    EXPECT_EQ(exported.graph.default_opset(), 21);
    int int4_weights = 0;
    for (const auto& [name, type] : exported.graph.narrow_types) int4_weights += type == 22;
    EXPECT_EQ(int4_weights, 7 * 2);  // 7 weights: the packed values and their zero points
    at::Tensor x = read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 64).to(at::kFloat).div(255).unsqueeze(1);
    write_npy(x, dir / "x.npy");
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0].detach();
    Executor ours(exported.graph, testing::shipped_registry());
    EXPECT_TRUE(at::allclose(ours.run({{"image", x}})[0], simulated, 1e-5, 1e-5)) << "A" << abits;
    for (const char* level : {"all", "disabled"}) {
      auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + path +
                                    " --optimization " + level + " --in image=" + (dir / "x.npy") + " --out logits=" + (dir / "y.npy"));
      ASSERT_EQ(r.exit_code, 0) << level << "\n" << r.output;
    }
    at::Tensor ort = read_npy(dir / "y.npy");  // the reference kernels (last run)
    const double step = 2 * simulated.abs().max().item<double>() / 255;
    EXPECT_LE((ort - simulated).abs().max().item<double>(), 2 * step) << "W4A" << abits;
  }
}

// Per-group weights (Note [Per-group quantization]) export as blocked DequantizeLinear at
// opset 21; our executor and ONNX Runtime reproduce the simulation.
TEST(OnnxRuntime, PerGroupWeightsExportAsBlockedDequantizeLinear) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (int bits : {8, 4}) {
    Config c = Config::from_string("backend = \"virtual\"\n[w]\nqscheme = \"per-group-symmetric\"\ngroup_size = 16\nbits = " +
                                       std::to_string(bits) + "\n[calibration]\ncount = 64\n",
                                   "group.toml");
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
    qm.calibrate(*data);
    const std::string path = dir / "group.onnx";
    qm.export_onnx(path);
    Model exported = load_onnx(path);
    EXPECT_EQ(exported.graph.default_opset(), 21);
    const Node* fc1_dq = nullptr;
    for (const Node* n : exported.graph.nodes())
      if (n->op_type == "DequantizeLinear" && n->inputs[0].rfind("fc1.weight", 0) == 0) fc1_dq = n;
    ASSERT_TRUE(fc1_dq);
    EXPECT_EQ(fc1_dq->attr_int("block_size", 0), 16);
    EXPECT_EQ(exported.graph.initializers.at(fc1_dq->inputs[1]).sizes(), (std::vector<std::int64_t>{128, 36}));  // 576 / 16
    at::Tensor x = read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 32).to(at::kFloat).div(255).unsqueeze(1);
    write_npy(x, dir / "x.npy");
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0].detach();
    Executor ours(exported.graph, testing::shipped_registry());
    EXPECT_TRUE(at::allclose(ours.run({{"image", x}})[0], simulated, 1e-5, 1e-5)) << bits;
    auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + path +
                                  " --optimization disabled --in image=" + (dir / "x.npy") + " --out logits=" + (dir / "y.npy"));
    ASSERT_EQ(r.exit_code, 0) << bits << "\n" << r.output;
    at::Tensor ort = read_npy(dir / "y.npy");
    // Float accumulation order differs between LibTorch and ONNX Runtime, which can flip an
    // intermediate rounding: allow two output steps (our executor above matched exactly).
    const double step = 2 * simulated.abs().max().item<double>() / 255;
    EXPECT_LE((ort - simulated).abs().max().item<double>(), 2 * step) << bits;
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
    c.calibration.count = 64;
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
    qm.calibrate(*data);
    const std::string path = dir / "a16.onnx";
    qm.export_onnx(path);
    Model exported = load_onnx(path);
    EXPECT_EQ(exported.graph.default_opset(), 21);
    at::Tensor x = read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 32).to(at::kFloat).div(255).unsqueeze(1);
    write_npy(x, dir / "x.npy");
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0].detach();
    Executor ours(exported.graph, testing::shipped_registry());
    EXPECT_TRUE(at::allclose(ours.run({{"image", x}})[0], simulated, 1e-5, 1e-5)) << scheme;
    auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + path +
                                  " --optimization disabled --in image=" + (dir / "x.npy") + " --out logits=" + (dir / "y.npy"));
    ASSERT_EQ(r.exit_code, 0) << scheme << "\n" << r.output;
    at::Tensor ort = read_npy(dir / "y.npy");
    EXPECT_TRUE(at::allclose(ort, simulated, 1e-4, 1e-3)) << scheme << ": max diff " << (ort - simulated).abs().max().item<float>();
  }
}

}  // namespace
}  // namespace sparsebit
