// The network layers against ONNX Runtime with the attributes exporters set: grouped, dilated
// and padded convolutions, transposed ones with output padding, pools with ceil mode and padding
// counted or not, normalizations and Gemm's transposes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

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
