// The network layers against ONNX Runtime with the attributes exporters set: grouped, dilated
// and padded convolutions, transposed ones with output padding, pools with ceil mode and padding
// counted or not, normalizations and Gemm's transposes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit::testing {
namespace {

class NnOps : public OrtOpTest {};

Attribute ints(std::vector<std::int64_t> v) { return Attribute::of_ints(std::move(v)); }

TEST_F(NnOps, ConvolutionsWithGroupsDilationsPaddingAndOutputPadding) {
  const at::Tensor x = at::randn({2, 4, 9, 7});
  expect_matches_ort({"Conv",
                      "",
                      {{"group", Attribute::of_int(2)},
                       {"dilations", ints({2, 1})},
                       {"strides", ints({1, 2})},
                       {"pads", ints({1, 0, 2, 1})}},
                      {{"x", x}, {"w", at::randn({6, 2, 3, 3})}, {"b", at::randn({6})}},
                      {"y"}},
                     1e-4);
  expect_matches_ort({"Conv",
                      "",
                      {{"auto_pad", Attribute::of_string("SAME_UPPER")}, {"strides", ints({2, 2})}},
                      {{"x", x}, {"w", at::randn({3, 4, 4, 4})}},
                      {"y"}},
                     1e-4);
  expect_matches_ort({"ConvTranspose",
                      "",
                      {{"strides", ints({2, 3})},
                       {"output_padding", ints({1, 2})},
                       {"pads", ints({1, 0, 0, 1})},
                       {"group", Attribute::of_int(2)}},
                      {{"x", x}, {"w", at::randn({4, 3, 3, 3})}, {"b", at::randn({6})}},
                      {"y"}},
                     1e-4);
}

TEST_F(NnOps, PoolsCountPaddingAndCeilAsAsked) {
  const at::Tensor x = at::randn({1, 3, 8, 7});
  expect_matches_ort({"MaxPool",
                      "",
                      {{"kernel_shape", ints({3, 3})},
                       {"strides", ints({2, 2})},
                       {"ceil_mode", Attribute::of_int(1)},
                       {"dilations", ints({1, 2})}},
                      {{"x", x}},
                      {"y"}});
  for (std::int64_t count : {0, 1})
    expect_matches_ort({"AveragePool",
                        "",
                        {{"kernel_shape", ints({3, 2})},
                         {"pads", ints({1, 1, 1, 0})},
                         {"count_include_pad", Attribute::of_int(count)}},
                        {{"x", x}},
                        {"y"}});
  expect_matches_ort({"GlobalAveragePool", "", {}, {{"x", x}}, {"y"}});
  expect_matches_ort(
      {"LRN", "", {{"size", Attribute::of_int(3)}, {"alpha", Attribute::of_float(0.01)}}, {{"x", x}}, {"y"}});
}

TEST_F(NnOps, NormalizationsAndGemm) {
  const at::Tensor x = at::randn({2, 3, 4, 5}) * 2 + 1;
  expect_matches_ort({"LayerNormalization",
                      "",
                      {{"axis", Attribute::of_int(-2)}, {"epsilon", Attribute::of_float(1e-3)}},
                      {{"x", x}, {"scale", at::randn({4, 5})}, {"bias", at::randn({4, 5})}},
                      {"y"}},
                     1e-4);
  expect_matches_ort(
      {"InstanceNormalization", "", {}, {{"x", x}, {"scale", at::randn({3})}, {"bias", at::randn({3})}}, {"y"}}, 1e-4);
  expect_matches_ort({"BatchNormalization",
                      "",
                      {},
                      {{"x", x},
                       {"scale", at::randn({3})},
                       {"bias", at::randn({3})},
                       {"mean", at::randn({3})},
                       {"var", at::rand({3}) + 0.5}},
                      {"y"}},
                     1e-4);
  expect_matches_ort({"Gemm",
                      "",
                      {{"transA", Attribute::of_int(1)},
                       {"transB", Attribute::of_int(1)},
                       {"alpha", Attribute::of_float(0.5)},
                       {"beta", Attribute::of_float(2.0)}},
                      {{"a", at::randn({6, 4})}, {"b", at::randn({3, 6})}, {"c", at::randn({3})}},
                      {"y"}},
                     1e-4);
  expect_matches_ort({"MatMul", "", {}, {{"a", at::randn({2, 1, 4, 6})}, {"b", at::randn({3, 6, 5})}}, {"y"}}, 1e-4);
}

}  // namespace
}  // namespace sparsebit::testing

namespace sparsebit::testing {
namespace {

const WeightedLayer& layer_of(const std::string& op) {
  const auto* layer = shipped_registry().op_trait<WeightedLayer>(op, "");
  if (!layer) throw Error("no WeightedLayer for " + op);
  return *layer;
}

// Axes and multiply-accumulates by hand: each output element of a Conv sums (in / group) x
// kernel products; each input element of a ConvTranspose feeds (out / group) x kernel outputs.
TEST(NnOpTraits, LayersGiveTheirAxesAndMacs) {
  using Shape = std::vector<std::int64_t>;
  const Node conv = make_node("c", "Conv", {"x", "w"}, {"y"});
  const Shape conv_y = {1, 16, 6, 6};
  EXPECT_EQ(layer_of("Conv").macs(conv, {1, 3, 8, 8}, {16, 3, 3, 3}, &conv_y), 16 * 36 * 27);
  EXPECT_EQ(layer_of("Conv").macs(conv, {1, 3, 8, 8}, {16, 3, 3, 3}, nullptr), 0);
  const auto conv_axes = *layer_of("Conv").axes(conv, 4);
  EXPECT_EQ((Shape{conv_axes.weight_out, conv_axes.weight_in, conv_axes.activation}), (Shape{0, 1, 1}));

  const Node deconv = make_node("d", "ConvTranspose", {"x", "w"}, {"y"});
  EXPECT_EQ(layer_of("ConvTranspose").macs(deconv, {1, 4, 5, 5}, {4, 2, 3, 3}, nullptr), 100 * 18);
  const auto deconv_axes = *layer_of("ConvTranspose").axes(deconv, 4);
  EXPECT_EQ((Shape{deconv_axes.weight_out, deconv_axes.weight_in}), (Shape{1, 0}));

  const Node gemm = make_node("g", "Gemm", {"x", "w"}, {"y"}, {{"transB", Attribute::of_int(1)}});
  const Shape gemm_y = {2, 7};
  EXPECT_EQ(layer_of("Gemm").macs(gemm, {2, 5}, {7, 5}, &gemm_y), 14 * 5);
  EXPECT_EQ(layer_of("Gemm").axes(gemm, 2)->weight_out, 0);
  EXPECT_EQ(layer_of("Gemm").axes(make_node("g", "Gemm", {"x", "w"}, {"y"}), 2)->weight_out, 1);
  // transA: A is [K, M], its features along axis 0; the output is still [M, N].
  const auto trans_a =
      *layer_of("Gemm").axes(make_node("g", "Gemm", {"x", "w"}, {"y"}, {{"transA", Attribute::of_int(1)}}), 2);
  EXPECT_EQ((Shape{trans_a.weight_out, trans_a.weight_in, trans_a.activation, trans_a.output_axis()}),
            (Shape{1, 0, 0, 1}));
  EXPECT_EQ(layer_of("Gemm").bias_input(gemm), std::optional<std::size_t>(2));
  EXPECT_FALSE(layer_of("Gemm").axes(gemm, 3));

  const Node matmul = make_node("m", "MatMul", {"x", "w"}, {"y"});
  const Shape matmul_y = {2, 3, 7};
  EXPECT_EQ(layer_of("MatMul").macs(matmul, {2, 3, 5}, {5, 7}, &matmul_y), 42 * 5);
  EXPECT_EQ(layer_of("MatMul").axes(matmul, 2)->activation, -1);
  EXPECT_EQ(layer_of("MatMul").axes(matmul, 2)->output_axis(), -1);
  EXPECT_FALSE(layer_of("MatMul").axes(matmul, 3)) << "a batch of weights is not one layer's";
  EXPECT_FALSE(layer_of("MatMul").bias_input(matmul));

  const Node grouped = make_node("c", "Conv", {"x", "w", "b"}, {"y"}, {{"group", Attribute::of_int(4)}});
  EXPECT_EQ(layer_of("Conv").groups(grouped), 4);
  EXPECT_EQ(layer_of("Conv").groups(conv), 1);
  EXPECT_EQ(layer_of("Conv").bias_input(grouped), std::optional<std::size_t>(2));
  EXPECT_FALSE(layer_of("Conv").axes(conv, 2));
}

// The order integer kernels add products in, written out by hand: a Conv's weight [O, I, kh, kw]
// is read channels last (tap major, input channel minor), Gemm's and MatMul's along K.
TEST(NnOpTraits, WeightsComeAsRowsInTheOrderIntegerKernelsPairThem) {
  const at::Tensor conv_w = at::arange(2 * 3 * 2 * 2).reshape({2, 3, 2, 2});
  const at::Tensor rows = layer_of("Conv").reduction_rows(make_node("c", "Conv", {"x", "w"}, {"y"}), conv_w);
  ASSERT_EQ(rows.sizes(), (at::IntArrayRef{2, 12}));
  // Output channel 1, tap (0, 1), input channels 0..2: w[1, c, 0, 1] = 12 + 4c + 1.
  EXPECT_TRUE(at::equal(rows[1].slice(0, 3, 6), at::tensor({13, 17, 21}, at::kLong)));
  EXPECT_FALSE(layer_of("ConvTranspose")
                   .reduction_rows(make_node("d", "ConvTranspose", {"x", "w"}, {"y"}), conv_w)
                   .defined());  // ONNX Runtime runs it in float

  const at::Tensor kn = at::arange(6).reshape({3, 2});  // [K, N]
  const Node gemm = make_node("g", "Gemm", {"x", "w"}, {"y"}, {{"transA", Attribute::of_int(1)}});
  EXPECT_TRUE(
      at::equal(layer_of("Gemm").reduction_rows(gemm, kn), at::tensor({0, 2, 4, 1, 3, 5}, at::kLong).view({2, 3})));
  const Node gemm_t = make_node("g", "Gemm", {"x", "w"}, {"y"}, {{"transB", Attribute::of_int(1)}});
  EXPECT_TRUE(at::equal(layer_of("Gemm").reduction_rows(gemm_t, kn), kn));  // [N, K] rows already
  const at::Tensor batched = at::arange(12).reshape({2, 3, 2});             // [B, K, N]
  const at::Tensor mm = layer_of("MatMul").reduction_rows(make_node("m", "MatMul", {"x", "w"}, {"y"}), batched);
  EXPECT_TRUE(at::equal(mm, at::tensor({0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11}, at::kLong).view({4, 3})));
}

// A vendor's layer that gives only its axes gets the channels-last order by default.
TEST(NnOpTraits, ALayerWithAxesAloneIsReadOutputAxisFirstInputAxisLast) {
  struct VendorLayer final : WeightedLayer {
    std::optional<LayerAxes> axes(const Node&, std::int64_t) const override { return LayerAxes{1, 0, 1}; }
    std::int64_t macs(const Node&, const std::vector<std::int64_t>&, const std::vector<std::int64_t>&,
                      const std::vector<std::int64_t>*) const override {
      return 0;
    }
  };
  const at::Tensor w = at::arange(2 * 3 * 4).reshape({2, 3, 4});  // [in 2, out 3, tap 4]
  const at::Tensor rows = VendorLayer().reduction_rows(make_node("v", "Vendor", {"x", "w"}, {"y"}), w);
  ASSERT_EQ(rows.sizes(), (at::IntArrayRef{3, 8}));
  // Output 2: taps 0..3, each with inputs 0, 1: w[i, 2, t] = 12 i + 8 + t.
  EXPECT_TRUE(at::equal(rows[2], at::tensor({8, 20, 9, 21, 10, 22, 11, 23}, at::kLong)));
}

// Bias compensation against the layers themselves (at::conv2d, a hand-written Gemm): the shift
// the layer asks its bias to gain is the mean change of each output when the weight loses
// `delta`, exactly, padding and groups included.
TEST(NnOpTraits, BiasShiftIsTheMeanChangeOfEachOutput) {
  at::manual_seed(5);
  const at::Tensor x = at::rand({3, 4, 9, 8}, at::kDouble) + 0.2;
  const at::Tensor w = at::randn({6, 2, 3, 3}, at::kDouble);
  const at::Tensor w_new = w * (at::rand_like(w) > 0.5).to(at::kDouble);
  const Node conv = make_node("c", "Conv", {"x", "w", "b"}, {"y"},
                              {{"group", Attribute::of_int(2)},
                               {"kernel_shape", ints({3, 3})},
                               {"pads", ints({1, 0, 2, 1})},
                               {"strides", ints({2, 1})},
                               {"dilations", ints({1, 2})}});
  const ActivationSums sums = layer_of("Conv").activation_sums(conv, x, 4);
  ASSERT_TRUE(sums.sum.defined());
  const at::Tensor shift = layer_of("Conv").bias_shift(conv, w - w_new, sums.sum / sums.count);
  const at::Tensor padded = at::constant_pad_nd(x, {0, 1, 1, 2});
  const at::Tensor change =
      (at::conv2d(padded, w, at::Tensor(), at::IntArrayRef{2, 1}, at::IntArrayRef{0, 0}, at::IntArrayRef{1, 2}, 2) -
       at::conv2d(padded, w_new, at::Tensor(), at::IntArrayRef{2, 1}, at::IntArrayRef{0, 0}, at::IntArrayRef{1, 2}, 2))
          .mean({0, 2, 3});
  EXPECT_TRUE(at::allclose(shift, change, 1e-10, 1e-12)) << shift << change;

  // Gemm: the output is alpha A B + beta C, so C gains alpha / beta of the product's change.
  const at::Tensor a = at::randn({7, 5}, at::kDouble) + 1.0, b = at::randn({3, 5}, at::kDouble);
  const at::Tensor b_new = b * (at::rand_like(b) > 0.5).to(at::kDouble);
  const Node gemm = make_node(
      "g", "Gemm", {"a", "b", "c"}, {"y"},
      {{"transB", Attribute::of_int(1)}, {"alpha", Attribute::of_float(0.5)}, {"beta", Attribute::of_float(2.0)}});
  const ActivationSums gemm_sums = layer_of("Gemm").activation_sums(gemm, a, 2);
  EXPECT_EQ(gemm_sums.count, 7);
  const at::Tensor gemm_shift = layer_of("Gemm").bias_shift(gemm, b - b_new, gemm_sums.sum / gemm_sums.count);
  const at::Tensor gemm_change = (0.5 * a.matmul(b.t()) - 0.5 * a.matmul(b_new.t())).mean(0);
  EXPECT_TRUE(at::allclose(gemm_shift * 2.0, gemm_change, 1e-10, 1e-12));
  EXPECT_DOUBLE_EQ(layer_of("Gemm").bias_factor(gemm), 2.0);

  // No bias can express a MatMul's, a ConvTranspose's or a transposed A's change.
  const Node matmul = make_node("m", "MatMul", {"a", "b"}, {"y"});
  EXPECT_FALSE(layer_of("MatMul").bias_shift(matmul, (b - b_new).t(), gemm_sums.sum / 7).defined());
  const Node deconv = make_node("d", "ConvTranspose", {"x", "w"}, {"y"});
  EXPECT_FALSE(layer_of("ConvTranspose").bias_shift(deconv, w - w_new, sums.sum / sums.count).defined());
  const Node trans_a = make_node("g", "Gemm", {"a", "b"}, {"y"}, {{"transA", Attribute::of_int(1)}});
  EXPECT_FALSE(layer_of("Gemm").bias_shift(trans_a, b - b_new, gemm_sums.sum / 7).defined());
}

// BatchNormalization's running statistics and its affine map against at::batch_norm in eval mode.
TEST(NnOpTraits, BatchNormalizationGivesItsStatisticsAndItsAffineMap) {
  const auto* bn = shipped_registry().op_trait<RunningStatistics>("BatchNormalization", "");
  ASSERT_NE(bn, nullptr);
  Graph g;
  const at::Tensor gamma = at::rand({4}) + 0.5, beta = at::randn({4}), mean = at::randn({4}), var = at::rand({4}) + 0.1;
  g.initializers = {{"gamma", gamma}, {"beta", beta}, {"mean", mean}, {"var", var}};
  Node n = make_node("bn", "BatchNormalization", {"x", "gamma", "beta", "mean", "var"}, {"y"},
                     {{"epsilon", Attribute::of_float(1e-3)}});
  const auto inputs = bn->statistics_inputs(n);
  ASSERT_TRUE(inputs);
  EXPECT_EQ(inputs->mean, 3u);
  EXPECT_EQ(inputs->var, 4u);
  const auto affine = bn->affine(g, n);
  ASSERT_TRUE(affine);
  const at::Tensor x = at::randn({2, 4, 3, 3});
  const at::Tensor y = at::batch_norm(x, gamma, beta, mean, var, false, 0.1, 1e-3, false);
  const at::Tensor mapped = x.to(at::kDouble) * affine->scale.view({1, 4, 1, 1}) + affine->shift.view({1, 4, 1, 1});
  EXPECT_TRUE(at::allclose(mapped.to(at::kFloat), y, 1e-5, 1e-6));
  n.attributes["training_mode"] = Attribute::of_int(1);
  EXPECT_FALSE(bn->affine(g, n)) << "training mode normalizes with the batch's statistics";
  EXPECT_FALSE(bn->statistics_inputs(make_node("bn", "BatchNormalization", {"x", "gamma", "beta"}, {"y"})));
}

// What ONNX Runtime refuses at session creation is refused at import, by the op's own check.
TEST(NnOpTraits, ConvAttributesAreCheckedAgainstTheWeightAtImport) {
  const auto* checks = shipped_registry().op_trait<ChecksAtImport>("Conv", "");
  ASSERT_NE(checks, nullptr);
  Graph g;
  g.initializers["w"] = at::zeros({6, 2, 3, 3});
  auto conv = [](std::map<std::string, Attribute> attrs) {
    return make_node("c", "Conv", {"x", "w"}, {"y"}, std::move(attrs));
  };
  EXPECT_NO_THROW(checks->check(conv({{"kernel_shape", ints({3, 3})}, {"group", Attribute::of_int(2)}}), g));
  std::string why = error_of([&] { checks->check(conv({{"kernel_shape", ints({5, 5})}}), g); });
  EXPECT_NE(why.find("kernel_shape [5, 5] disagrees with the weight's spatial dims"), std::string::npos) << why;
  EXPECT_NE(why.find("'w' has shape [6, 2, 3, 3]"), std::string::npos) << why;
  why = error_of([&] { checks->check(conv({{"group", Attribute::of_int(4)}}), g); });
  EXPECT_NE(why.find("group 4 does not divide the 6 output channels"), std::string::npos) << why;
  why = error_of([&] { checks->check(conv({{"strides", ints({1})}}), g); });
  EXPECT_NE(why.find("strides has 1 values for 2 spatial dims"), std::string::npos) << why;
  // ConvTranspose's weight is [in, out / group, k...]: the group divides the input channels.
  const auto* deconv = shipped_registry().op_trait<ChecksAtImport>("ConvTranspose", "");
  ASSERT_NE(deconv, nullptr);
  EXPECT_NO_THROW(
      deconv->check(make_node("d", "ConvTranspose", {"x", "w"}, {"y"}, {{"group", Attribute::of_int(3)}}), g));
}

}  // namespace
}  // namespace sparsebit::testing
