// The data-movement ops against ONNX Runtime with what exporters' Shape/Slice/Gather chains
// use: negative steps and indices, batch dimensions, reductions in scatters, padding modes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class TensorOps : public OrtOpTest {};

at::Tensor i64(std::vector<std::int64_t> v) { return at::tensor(v, at::kLong); }

TEST_F(TensorOps, SlicesGathersAndScatters) {
  const at::Tensor x = at::randn({4, 5, 6});
  expect_matches_ort(
      {"Slice",
       "",
       {},
       {{"x", x}, {"starts", i64({-1, 1})}, {"ends", i64({-100, 6})}, {"axes", i64({0, 2})}, {"steps", i64({-2, 2})}},
       {"y"}},
      0);
  expect_matches_ort(
      {"Gather", "", {{"axis", Attribute::of_int(1)}}, {{"x", x}, {"i", i64({-1, 0, 3, -5}).reshape({2, 2})}}, {"y"}},
      0);
  expect_matches_ort({"GatherElements",
                      "",
                      {{"axis", Attribute::of_int(2)}},
                      {{"x", x}, {"i", at::randint(-6, 6, {4, 5, 3}, at::kLong)}},
                      {"y"}},
                     0);
  expect_matches_ort({"GatherND",
                      "",
                      {{"batch_dims", Attribute::of_int(1)}},
                      {{"x", x}, {"i", at::randint(0, 5, {4, 3, 1}, at::kLong)}},
                      {"y"}},
                     0);
  for (const char* reduction : {"none", "add", "mul"})
    expect_matches_ort({"ScatterElements",
                        "",
                        {{"axis", Attribute::of_int(1)}, {"reduction", Attribute::of_string(reduction)}},
                        {{"x", x},
                         {"i", at::tensor({0, 2, 4}, at::kLong).reshape({1, 3, 1}).expand({4, 3, 6}).contiguous()},
                         {"u", at::randn({4, 3, 6})}},
                        {"y"},
                        16},
                       1e-5);
  expect_matches_ort({"ScatterND",
                      "",
                      {{"reduction", Attribute::of_string("add")}},
                      {{"x", x}, {"i", i64({1, 3, 1}).reshape({3, 1})}, {"u", at::randn({3, 5, 6})}},
                      {"y"},
                      16});
}

TEST_F(TensorOps, PaddingTilingAndShapes) {
  const at::Tensor x = at::randn({2, 3, 4, 5});
  for (const char* mode : {"constant", "reflect", "edge"})
    expect_matches_ort({"Pad",
                        "",
                        {{"mode", Attribute::of_string(mode)}},
                        {{"x", x}, {"pads", i64({0, 0, 1, 2, 0, 1, 2, 1})}, {"v", at::scalar_tensor(0.5)}},
                        {"y"}},
                       0);
  expect_matches_ort({"Tile", "", {}, {{"x", x}, {"r", i64({1, 2, 1, 3})}}, {"y"}}, 0);
  expect_matches_ort({"Expand", "", {}, {{"x", at::randn({3, 1, 5})}, {"s", i64({2, 1, 4, 1})}}, {"y"}}, 0);
  expect_matches_ort(
      {"Trilu", "", {{"upper", Attribute::of_int(0)}}, {{"x", x}, {"k", at::scalar_tensor(1, at::kLong)}}, {"y"}}, 0);
  expect_matches_ort({"DepthToSpace",
                      "",
                      {{"blocksize", Attribute::of_int(2)}, {"mode", Attribute::of_string("CRD")}},
                      {{"x", at::randn({1, 8, 2, 3})}},
                      {"y"}},
                     0);
  expect_matches_ort(
      {"SpaceToDepth", "", {{"blocksize", Attribute::of_int(2)}}, {{"x", at::randn({1, 2, 4, 6})}}, {"y"}}, 0);
  expect_matches_ort({"Flatten", "", {{"axis", Attribute::of_int(-2)}}, {{"x", x}}, {"y"}}, 0);
  expect_matches_ort({"Split", "", {{"axis", Attribute::of_int(3)}}, {{"x", x}, {"s", i64({1, 4})}}, {"a", "b"}}, 0);
}

TEST_F(TensorOps, DataDependentShapes) {
  const at::Tensor x = at::tensor({1.0f, 0.0f, 3.0f, 3.0f, 0.0f, -2.0f, 1.0f, 5.0f}).reshape({2, 4});
  expect_matches_ort({"NonZero", "", {}, {{"x", x}}, {"y"}}, 0);
  expect_matches_ort(
      {"Unique", "", {{"sorted", Attribute::of_int(1)}}, {{"x", x}}, {"y", "indices", "inverse", "counts"}}, 0);
  expect_matches_ort(
      {"Compress", "", {{"axis", Attribute::of_int(1)}}, {{"x", x}, {"c", at::tensor({1, 0, 1}).to(at::kBool)}}, {"y"}},
      0);
  expect_matches_ort(
      {"OneHot",
       "",
       {{"axis", Attribute::of_int(-1)}},
       {{"i", i64({0, -1, 2, 4})}, {"depth", at::scalar_tensor(5, at::kLong)}, {"values", at::tensor({-1.0f, 2.0f})}},
       {"y"}},
      0);
  expect_matches_ort({"Range",
                      "",
                      {},
                      {{"a", at::scalar_tensor(1.0)}, {"b", at::scalar_tensor(-4.0)}, {"d", at::scalar_tensor(-1.5)}},
                      {"y"}},
                     1e-6);
  expect_matches_ort({"ReverseSequence",
                      "",
                      {{"batch_axis", Attribute::of_int(1)}, {"time_axis", Attribute::of_int(0)}},
                      {{"x", at::randn({4, 3, 2})}, {"l", i64({4, 2, 1})}},
                      {"y"}},
                     0);
}

}  // namespace
}  // namespace sparsebit::testing
