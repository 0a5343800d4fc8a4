// The ops of models quantized elsewhere against ONNX Runtime: Q/DQ per tensor and per axis,
// dynamic quantization, and the integer kernels with their zero points.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class QuantizationOps : public OrtOpTest {};

at::Tensor u8(std::vector<std::int64_t> shape) { return at::randint(0, 256, shape).to(at::kByte); }
// Inputs of the integer kernels keep to 7 bits: ONNX Runtime's AVX2 kernels (no VNNI) add u8 x s8
// products in pairs within 16 bits and saturate beyond, 2 * 127 * 128 stays inside on any processor.
at::Tensor u7(std::vector<std::int64_t> shape) { return at::randint(0, 128, shape).to(at::kByte); }
at::Tensor s8(std::vector<std::int64_t> shape) { return at::randint(-128, 128, shape).to(at::kChar); }

// Power-of-two scales: x / scale is exact in ours and ONNX Runtime's, so the integers agree.
TEST_F(QuantizationOps, QuantizeAndDequantizePerTensorAndPerAxis) {
  const at::Tensor x = at::randn({2, 3, 4}) * 4;
  const at::Tensor scales = at::tensor({0.03125f, 0.0625f, 0.125f});
  expect_matches_ort({"QuantizeLinear",
                      "",
                      {},
                      {{"x", x}, {"s", at::scalar_tensor(0.0625)}, {"z", at::scalar_tensor(128, at::kByte)}},
                      {"y"}},
                     0);
  expect_matches_ort({"QuantizeLinear",
                      "",
                      {{"axis", Attribute::of_int(1)}},
                      {{"x", x}, {"s", scales}, {"z", at::tensor({0, -3, 5}, at::kChar)}},
                      {"y"}},
                     0);
  expect_matches_ort({"DequantizeLinear",
                      "",
                      {{"axis", Attribute::of_int(1)}},
                      {{"q", s8({2, 3, 4})}, {"s", scales}, {"z", at::tensor({0, -3, 5}, at::kChar)}},
                      {"y"}},
                     0);
  expect_matches_ort({"DequantizeLinear",
                      "",
                      {},
                      {{"q", u8({5, 4})}, {"s", at::scalar_tensor(0.1)}, {"z", at::scalar_tensor(7, at::kByte)}},
                      {"y"}},
                     1e-6);
  expect_matches_ort({"DynamicQuantizeLinear", "", {}, {{"x", x}}, {"y", "scale", "zero_point"}}, 1e-6);
}

TEST_F(QuantizationOps, IntegerKernelsWithZeroPoints) {
  expect_matches_ort({"MatMulInteger",
                      "",
                      {},
                      {{"a", u7({2, 5, 8})},
                       {"b", s8({8, 6})},
                       {"az", at::scalar_tensor(3, at::kByte)},
                       {"bz", at::tensor({0, 1, -1, 2, 0, 4}, at::kChar)}},
                      {"y"}},
                     0);
  expect_matches_ort({"QLinearMatMul",
                      "",
                      {},
                      {{"a", u7({5, 8})},
                       {"as", at::scalar_tensor(0.02)},
                       {"az", at::scalar_tensor(120, at::kByte)},
                       {"b", u7({8, 6})},
                       {"bs", at::scalar_tensor(0.03)},
                       {"bz", at::scalar_tensor(128, at::kByte)},
                       {"ys", at::scalar_tensor(0.05)},
                       {"yz", at::scalar_tensor(100, at::kByte)}},
                      {"y"}},
                     1);
  expect_matches_ort({"QLinearConv",
                      "",
                      {{"pads", Attribute::of_ints({1, 1, 1, 1})}},
                      {{"x", u7({1, 3, 6, 6})},
                       {"xs", at::scalar_tensor(0.02)},
                       {"xz", at::scalar_tensor(128, at::kByte)},
                       {"w", s8({4, 3, 3, 3})},
                       {"ws", at::tensor({0.01f, 0.02f, 0.015f, 0.03f})},
                       {"wz", at::zeros({4}, at::kChar)},
                       {"ys", at::scalar_tensor(0.5)},
                       {"yz", at::scalar_tensor(10, at::kByte)},
                       {"b", at::randint(-500, 500, {4}).to(at::kInt)}},
                      {"y"}},
                     1);
  expect_matches_ort({"ConvInteger",
                      "",
                      {},
                      {{"x", u7({1, 2, 5, 5})}, {"w", u7({3, 2, 2, 2})}, {"xz", at::scalar_tensor(100, at::kByte)}},
                      {"y"}},
                     0);
}

}  // namespace
}  // namespace sparsebit::testing
