// What ONNX Runtime makes of an `onnxruntime` export: its optimized graph (optimizedModelFilePath,
// tests/ort/optimized_model.mjs) read back and counted. Every convolution the export quantizes
// must become QLinearConv, and no float convolution may read a DequantizeLinear: that is what
// made exports slower than the float model (Note [ONNX Runtime placement]). The counts hold on
// every processor: ONNX Runtime's QDQ fusions do not depend on VNNI.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <fstream>
#include <map>
#include <set>

#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "test_support.h"

namespace sparsebit {
namespace {

onnx::ModelProto read_model(const std::string& path) {
  onnx::ModelProto m;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in)) << path;
  return m;
}

std::map<std::string, int> op_counts(const onnx::ModelProto& m) {
  std::map<std::string, int> out;
  for (const auto& n : m.graph().node()) ++out[n.op_type()];
  return out;
}

/// Nodes of `ops` that read a DequantizeLinear's output (directly or through the layout change
/// ONNX Runtime puts before its NCHWc float convolutions).
int reading_dequantized(const onnx::ModelProto& m, const std::set<std::string>& ops) {
  std::set<std::string> dequantized;
  for (const auto& n : m.graph().node())  // nodes come in topological order
    if (n.op_type() == "DequantizeLinear" || (n.op_type() == "ReorderInput" && dequantized.count(n.input(0))))
      dequantized.insert(n.output(0));
  int count = 0;
  for (const auto& n : m.graph().node())
    if (ops.count(n.op_type()) && n.input_size() > 0 && dequantized.count(n.input(0))) ++count;
  return count;
}

// A PP-LCNet-style block as PaddlePaddle exports it (a learnable affine Mul/Add after the stem,
// HardSwish written out as Add, Clip, Mul and Div), a depthwise and a pointwise convolution, a
// residual pair of 3x3 convolutions with Relu, global pooling and a classifier.
Graph paddle_style_cnn() {
  Graph g;
  g.opset_imports[""] = 11;
  g.inputs = {{"x", 1, true, {{1, ""}, {3, ""}, {32, ""}, {32, ""}}, ""}};
  g.outputs = {{"y", 1, true, {{1, ""}, {10, ""}}, ""}};
  auto& w = g.initializers;
  w["w_stem"] = at::randn({16, 3, 3, 3}) * 0.3;
  w["a"] = at::full({1}, 1.2f);
  w["b"] = at::full({1}, 0.1f);
  w["three"] = at::full({}, 3.0f);
  w["zero"] = at::full({}, 0.0f);
  w["six"] = at::full({}, 6.0f);
  w["w_dw"] = at::randn({16, 1, 3, 3}) * 0.3;
  w["w_pw"] = at::randn({32, 16, 1, 1}) * 0.25;
  w["w_c1"] = at::randn({32, 32, 3, 3}) * 0.06;
  w["w_c2"] = at::randn({32, 32, 3, 3}) * 0.06;
  w["w_fc"] = at::randn({10, 32}) * 0.2;
  w["b_fc"] = at::randn({10}) * 0.1;
  using testing::make_node;
  auto hardswish = [&](const std::string& x, const std::string& y) {
    g.append(make_node(y + "_add", "Add", {x, "three"}, {y + "_a"}));
    g.append(make_node(y + "_clip", "Clip", {y + "_a", "zero", "six"}, {y + "_c"}));
    g.append(make_node(y + "_mul", "Mul", {x, y + "_c"}, {y + "_m"}));
    g.append(make_node(y + "_div", "Div", {y + "_m", "six"}, {y}));
  };
  const auto pad1 = Attribute::of_ints({1, 1, 1, 1});
  g.append(
      make_node("stem", "Conv", {"x", "w_stem"}, {"s"}, {{"pads", pad1}, {"strides", Attribute::of_ints({2, 2})}}));
  g.append(make_node("lab_mul", "Mul", {"a", "s"}, {"s1"}));
  g.append(make_node("lab_add", "Add", {"s1", "b"}, {"s2"}));
  hardswish("s2", "h1");
  g.append(make_node("dw", "Conv", {"h1", "w_dw"}, {"d"}, {{"pads", pad1}, {"group", Attribute::of_int(16)}}));
  hardswish("d", "h2");
  g.append(make_node("pw", "Conv", {"h2", "w_pw"}, {"p"}));
  g.append(make_node("relu0", "Relu", {"p"}, {"r0"}));
  g.append(make_node("c1", "Conv", {"r0", "w_c1"}, {"c1o"}, {{"pads", pad1}}));
  g.append(make_node("relu1", "Relu", {"c1o"}, {"r1"}));
  g.append(make_node("c2", "Conv", {"r1", "w_c2"}, {"c2o"}, {{"pads", pad1}}));
  g.append(make_node("res", "Add", {"c2o", "r0"}, {"sum"}));
  g.append(make_node("relu2", "Relu", {"sum"}, {"r2"}));
  g.append(make_node("gap", "GlobalAveragePool", {"r2"}, {"pool"}));
  g.append(make_node("flat", "Flatten", {"pool"}, {"f"}));
  g.append(make_node("fc", "Gemm", {"f", "w_fc", "b_fc"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  return g;
}

TEST(OnnxRuntimeFusion, EveryConvolutionTheExportQuantizesRunsAsQLinearConv) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(3);
  save_onnx(paddle_style_cnn(), ModelMeta{}, dir / "float.onnx");
  std::filesystem::create_directories(dir / "calib");
  for (int i = 0; i < 8; ++i) write_npy(at::randn({3, 32, 32}), dir / ("calib/" + std::to_string(i) + ".npy"));
  const auto q = testing::run_cli("quantize " + dir / "float.onnx" + " -c " +
                                  testing::source_path("configs/w8a8_onnxruntime.toml") + " --calib " + dir / "calib" +
                                  " -o " + dir / "q.onnx --no-latency");  // the static placement
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const auto opt = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR +
                                        "/optimized_model.mjs " + dir / "q.onnx" + " " + dir / "optimized.onnx");
  ASSERT_EQ(opt.exit_code, 0) << opt.output;
  const onnx::ModelProto exported = read_model(dir / "q.onnx"), optimized = read_model(dir / "optimized.onnx");
  const int quantized_convs = reading_dequantized(exported, {"Conv"});
  const auto counts = op_counts(optimized);
  // The pointwise convolution and the residual pair at least (the stem and the depthwise
  // convolution sit between float HardSwish arithmetic and may go either way by their cost).
  EXPECT_GE(quantized_convs, 3);
  EXPECT_EQ(counts.count("QLinearConv") ? counts.at("QLinearConv") : 0, quantized_convs);
  EXPECT_EQ(reading_dequantized(optimized, {"Conv", "FusedConv", "Gemm", "MatMul"}), 0)
      << "a float op behind a DequantizeLinear that the export meant to run in integers";
  EXPECT_EQ(counts.count("QLinearAdd") ? counts.at("QLinearAdd") : 0, 1) << "the residual Add";
  EXPECT_EQ(counts.count("QGemm") ? counts.at("QGemm") : 0, 1);
  // The Mul/Add after the stem fold into it and the written-out HardSwish becomes two ops.
  EXPECT_EQ(op_counts(exported).count("Div"), 0u);
  EXPECT_EQ(op_counts(exported).count("Clip"), 0u);
}

// Conv, Relu, MaxPool, Conv, Relu, global pooling, Flatten and a classifier, as torchvision's
// CNNs end: the MaxPool and the Flatten move 8-bit data once the Q/DQ around each share a grid
// (Note [ONNX Runtime placement], step 4), so ONNX Runtime dequantizes nothing before the
// classifier, and its outputs match the simulation's: with weights on a 7-bit grid, whose
// integer sums are the same on x86 processors with and without VNNI (Note [u8s8 saturation]).
// The first convolution's 3 input channels are padded to 4 on the 8-bit data (Note [ONNX
// Runtime channel padding]), which leaves the sums as they are.
TEST(OnnxRuntimeFusion, MaxPoolAndFlattenRunOnTheIntegers) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  at::manual_seed(4);
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, true, {{1, ""}, {3, ""}, {32, ""}, {32, ""}}, ""}};
  g.outputs = {{"y", 1, true, {{1, ""}, {10, ""}}, ""}};
  g.initializers["w1"] = at::randn({32, 3, 3, 3}) * 0.3;
  g.initializers["w2"] = at::randn({32, 32, 3, 3}) * 0.08;
  g.initializers["b2"] = at::randn({32}) * 0.1;  // its scale follows the tied input grid's
  g.initializers["w_fc"] = at::randn({10, 32}) * 0.2;
  g.initializers["b_fc"] = at::randn({10}) * 0.1;
  using testing::make_node;
  const auto pad1 = Attribute::of_ints({1, 1, 1, 1});
  g.append(make_node("conv1", "Conv", {"x", "w1"}, {"c1"}, {{"pads", pad1}}));
  g.append(make_node("relu1", "Relu", {"c1"}, {"r1"}));
  g.append(make_node("pool", "MaxPool", {"r1"}, {"p"},
                     {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}}));
  g.append(make_node("conv2", "Conv", {"p", "w2", "b2"}, {"c2"}, {{"pads", pad1}}));
  g.append(make_node("relu2", "Relu", {"c2"}, {"r2"}));
  g.append(make_node("gap", "GlobalAveragePool", {"r2"}, {"a"}));
  g.append(make_node("flat", "Flatten", {"a"}, {"f"}));
  g.append(make_node("fc", "Gemm", {"f", "w_fc", "b_fc"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  save_onnx(g, ModelMeta{}, dir / "float.onnx");
  std::filesystem::create_directories(dir / "calib");
  for (int i = 0; i < 8; ++i) write_npy(at::randn({3, 32, 32}), dir / ("calib/" + std::to_string(i) + ".npy"));
  write_npy(at::randn({1, 3, 32, 32}), dir / "eval.npy");
  const auto q = testing::run_cli("quantize " + dir / "float.onnx" + " -c " +
                                  testing::source_path("configs/w8a8_onnxruntime_reduce_range.toml") + " --calib " +
                                  dir / "calib" + " -o " + dir / "q.onnx --no-latency --eval-data " + dir / "eval.npy" +
                                  " --eval-outputs " + dir / "simulated.npy");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const auto opt = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR +
                                        "/optimized_model.mjs " + dir / "q.onnx" + " " + dir / "optimized.onnx");
  ASSERT_EQ(opt.exit_code, 0) << opt.output;
  const auto counts = op_counts(read_model(dir / "optimized.onnx"));
  auto count = [&](const std::string& op) { return counts.count(op) ? counts.at(op) : 0; };
  EXPECT_EQ(count("QLinearConv"), 2);
  EXPECT_EQ(count("DequantizeLinear"), 0) << "a DQ left before the MaxPool or the Flatten";
  EXPECT_EQ(count("QuantizeLinear"), 1) << "the model's input only";
  EXPECT_EQ(count("MaxPool") + count("NhwcMaxPool"), 1) << "on 8-bit data in the integer layout or not";
  EXPECT_EQ(count("Pad"), 1) << "the first convolution's input channels, 3 -> 4";
  const auto run = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " +
                                        dir / "q.onnx" + " --in x=" + dir / "eval.npy" + " --out y=" + dir / "ort.npy");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const at::Tensor ort = read_npy(dir / "ort.npy"), simulated = read_npy(dir / "simulated.npy");
  EXPECT_LT((ort - simulated.reshape_as(ort)).abs().max().item<double>(),
            1e-3 + 0.02 * simulated.abs().max().item<double>());
}

}  // namespace
}  // namespace sparsebit
