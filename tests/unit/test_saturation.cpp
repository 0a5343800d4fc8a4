// Note [u8s8 saturation]: the check against hand-made integer weights on both sides of the
// bound (|w_i| + |w_j|) x 255 <= 32767, in the pairing order of each op, and on real exports.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/core/saturation.h"
#include "test_support.h"

namespace sparsebit {
namespace {

const OpTraitTable& ops() {
  static const OpTraitTable shipped(testing::shipped_registry());
  return shipped;
}

/// x -> Q/DQ (uint8 or float) -> OP(x, DQ(w int8)) -> y
Graph layer(const std::string& op, const at::Tensor& w, std::map<std::string, Attribute> attrs = {},
            bool quantized_input = true) {
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  g.initializers["s"] = at::scalar_tensor(0.1f);
  g.initializers["zp"] = at::scalar_tensor(128, at::kByte);
  g.initializers["w_q"] = w.to(at::kChar);
  g.initializers["w_s"] = at::scalar_tensor(0.01f);
  std::string x = "x";
  if (quantized_input) {
    g.append(testing::make_node("q", "QuantizeLinear", {"x", "s", "zp"}, {"xq"}));
    g.append(testing::make_node("dq", "DequantizeLinear", {"xq", "s", "zp"}, {"xd"}));
    x = "xd";
  }
  g.append(testing::make_node("wdq", "DequantizeLinear", {"w_q", "w_s"}, {"w"}));
  g.append(testing::make_node("layer", op, {x, "w"}, {"y"}, std::move(attrs)));
  return g;
}

at::Tensor ints(std::vector<std::int64_t> v, std::vector<std::int64_t> shape) {
  return at::tensor(v, at::kLong).reshape(shape);
}

TEST(Saturation, GemmPairsAlongKOnBothSidesOfTheBound) {
  // Pairs (64, 64): 128 x 255 = 32640 fits; (65, 64): 129 x 255 = 32895 does not.
  const at::Tensor fits = ints({64, 64, -1, 1, -64, -64, 0, 0}, {2, 4});
  SaturationCheck c = check_u8s8_saturation(layer("Gemm", fits, {{"transB", Attribute::of_int(1)}}), ops());
  EXPECT_EQ(c.layers_checked, 1);
  EXPECT_TRUE(c.at_risk.empty());

  const at::Tensor over = ints({64, 64, 1, 1, -65, -64, 0, 0}, {2, 4});
  c = check_u8s8_saturation(layer("Gemm", over, {{"transB", Attribute::of_int(1)}}), ops());
  ASSERT_EQ(c.at_risk.size(), 1u);
  EXPECT_EQ(c.at_risk[0].node, "layer");
  EXPECT_EQ(c.at_risk[0].weight, "w_q");
  EXPECT_EQ(c.at_risk[0].pairs, 4);
  EXPECT_EQ(c.at_risk[0].pairs_over, 1);
  EXPECT_EQ(c.at_risk[0].worst_pair, 129);
  // Without transB the same matrix is [K, N]: K runs down the columns.
  c = check_u8s8_saturation(layer("Gemm", over.t().contiguous()), ops());
  ASSERT_EQ(c.at_risk.size(), 1u);
  EXPECT_EQ(c.at_risk[0].worst_pair, 129);
  const std::string warning = saturation_warning(c);
  EXPECT_NE(warning.find("node 'layer' (Gemm"), std::string::npos) << warning;
  EXPECT_NE(warning.find("reduce_range = true"), std::string::npos) << warning;
  EXPECT_TRUE(saturation_warning(check_u8s8_saturation(layer("Gemm", fits, {{"transB", Attribute::of_int(1)}}), ops()))
                  .empty());
}

TEST(Saturation, TheWarningNamesTheThreeWorstLayersAndCountsTheRest) {
  SaturationCheck c;
  c.layers_checked = 6;
  // Shares of pairs over: a 10%, b 50%, c 20%, d 90%, e 5%.
  const std::vector<std::pair<std::string, std::int64_t>> over{{"a", 10}, {"b", 50}, {"c", 20}, {"d", 90}, {"e", 5}};
  for (const auto& [name, n] : over) c.at_risk.push_back(SaturationRisk{name, "Conv", name + "_w", 100, n, 250});
  const std::string w = saturation_warning(c);
  EXPECT_NE(w.find("5 of 6 Conv/MatMul/Gemm layers"), std::string::npos) << w;
  const auto d = w.find("node 'd'"), b = w.find("node 'b'"), cc = w.find("node 'c'");
  ASSERT_NE(d, std::string::npos) << w;
  ASSERT_NE(b, std::string::npos) << w;
  ASSERT_NE(cc, std::string::npos) << w;
  EXPECT_LT(d, b);
  EXPECT_LT(b, cc);
  EXPECT_EQ(w.find("node 'a'"), std::string::npos) << w;
  EXPECT_EQ(w.find("node 'e'"), std::string::npos) << w;
  EXPECT_NE(w.find("and 2 more (`sparsebit inspect`"), std::string::npos) << w;
  EXPECT_NE(w.find("reduce_range = true"), std::string::npos) << w;
}

TEST(Saturation, LayersInsideControlFlowBodiesAreChecked) {
  // The over-the-bound Gemm of the test above, as the then-branch of an If.
  Graph branch = layer("Gemm", ints({64, 64, 1, 1, -65, -64, 0, 0}, {2, 4}), {{"transB", Attribute::of_int(1)}});
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {ValueInfo{"c", 9, false, {}, ""}};
  g.outputs = {ValueInfo{"z", 1, false, {}, ""}};
  Graph other = branch.clone();
  Node cond = testing::make_node("if", "If", {"c"}, {"z"});
  cond.attributes["then_branch"] = Attribute::of_graph(std::move(branch));
  cond.attributes["else_branch"] = Attribute::of_graph(std::move(other));
  g.append(std::move(cond));
  const SaturationCheck c = check_u8s8_saturation(g, ops());
  EXPECT_EQ(c.layers_checked, 2);
  ASSERT_EQ(c.at_risk.size(), 2u);
  EXPECT_EQ(c.at_risk[0].worst_pair, 129);
}

TEST(Saturation, ConvPairsInputChannelsAtEachKernelPosition) {
  // W[0, c, 0, k]: in ONNX order (c major) the pairs are (100, 0) twice; ONNX Runtime's
  // channels-last filters pair the two channels at kernel position 0: 100 + 100.
  const at::Tensor w = ints({100, 0, 100, 0}, {1, 2, 1, 2});
  SaturationCheck c = check_u8s8_saturation(layer("Conv", w), ops());
  ASSERT_EQ(c.at_risk.size(), 1u);
  EXPECT_EQ(c.at_risk[0].worst_pair, 200);
  EXPECT_EQ(c.at_risk[0].pairs, 2);
  EXPECT_EQ(c.at_risk[0].pairs_over, 1);
  EXPECT_TRUE(check_u8s8_saturation(layer("Conv", ints({100, 100, 0, 0}, {1, 2, 1, 2})), ops()).at_risk.empty());
}

TEST(Saturation, OddReductionLengthPairsTheLastWeightWithZero) {
  SaturationCheck c = check_u8s8_saturation(layer("MatMul", ints({1, 127, 127}, {3, 1})), ops());
  EXPECT_EQ(c.layers_checked, 1);
  EXPECT_TRUE(c.at_risk.empty());  // (1, 127) = 128 and (127, 0)
  c = check_u8s8_saturation(layer("MatMul", ints({2, 127, 127}, {3, 1})), ops());
  ASSERT_EQ(c.at_risk.size(), 1u);
  EXPECT_EQ(c.at_risk[0].worst_pair, 129);
}

TEST(Saturation, FloatActivationsAreNotIntegerLayers) {
  const SaturationCheck c =
      check_u8s8_saturation(layer("Gemm", ints({127, 127}, {1, 2}), {{"transB", Attribute::of_int(1)}}, false), ops());
  EXPECT_EQ(c.layers_checked, 0);
  EXPECT_TRUE(c.at_risk.empty());
}

// Real exports: full 8-bit per-channel weights put pairs over the bound in the bundled CNN;
// the 7-bit reduce-range grid never does.
TEST(Saturation, ReduceRangeExportsCannotSaturate) {
  for (const char* cfg : {"w8a8_onnxruntime.toml", "w8a8_onnxruntime_reduce_range.toml"}) {
    Config c = Config::from_file(testing::source_path(std::string("configs/") + cfg));
    c.calibration.count = 64;
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
    qm.calibrate(*data);
    const SaturationCheck check = check_u8s8_saturation(qm.export_graph(), ops());
    EXPECT_EQ(check.layers_checked, 7) << cfg;
    if (c.w.reduce_range) {
      EXPECT_TRUE(check.at_risk.empty()) << cfg;
      for (const auto& s : qm.slots())
        if (s.role == InputRole::kWeight && s.calibrated) EXPECT_EQ(s.spec.qmax(), 63) << s.where();
    } else {
      EXPECT_FALSE(check.at_risk.empty()) << cfg;
    }
  }
}

TEST(Saturation, ReduceRangeIsAWeightOptionFor8Bits) {
  testing::TempDir dir;
  auto load = [&](const std::string& text) {
    testing::write_text(dir / "c.toml", text);
    return testing::error_of([&] { Config::from_file(dir / "c.toml"); });
  };
  testing::write_text(dir / "ok.toml", "backend = \"onnxruntime\"\n[w]\nreduce_range = true\n");
  EXPECT_TRUE(Config::from_file(dir / "ok.toml").w.reduce_range);
  EXPECT_NE(load("backend = \"onnxruntime\"\n[a]\nreduce_range = true\n").find("a.reduce_range"), std::string::npos);
  EXPECT_NE(load("backend = \"virtual\"\n[w]\nbits = 4\nreduce_range = true\n").find("needs bits = 8"),
            std::string::npos);
  // TensorRT's kernels do not saturate: the option is refused when the model is built.
  testing::write_text(dir / "trt.toml",
                      "backend = \"tensorrt\"\n[w]\nreduce_range = true\n[a]\nqscheme = \"per-tensor-symmetric\"\n");
  const std::string why = testing::error_of([&] {
    QuantModel qm(load_onnx(testing::fixture_model()), Config::from_file(dir / "trt.toml"),
                  testing::shipped_registry());
  });
  EXPECT_NE(why.find("reduce_range"), std::string::npos) << why;
  EXPECT_NE(why.find("TensorRT"), std::string::npos) << why;
}

}  // namespace
}  // namespace sparsebit
