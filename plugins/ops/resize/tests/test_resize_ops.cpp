// Resize against ONNX Runtime in the modes exporters write: linear with half-pixel centres,
// nearest with its rounding modes, cubic with its coefficient and outside exclusion, by scales
// and by sizes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class ResizeOps : public OrtOpTest {};

OpCase resize(const at::Tensor& x, std::map<std::string, Attribute> attributes, const at::Tensor& scales,
              const at::Tensor& sizes = {}) {
  OpCase c{"Resize", "", std::move(attributes), {{"x", x}, {"", {}}}, {"y"}, 13};
  c.inputs.emplace_back(scales.defined() ? "scales" : "", scales);
  if (sizes.defined()) c.inputs.emplace_back("sizes", sizes);
  return c;
}

TEST_F(ResizeOps, LinearNearestAndCubic) {
  const at::Tensor x = at::randn({1, 2, 5, 6});
  const at::Tensor up = at::tensor({1.0f, 1.0f, 2.0f, 1.5f}), down = at::tensor({1.0f, 1.0f, 0.6f, 0.5f});
  const auto s = [](const char* v) { return Attribute::of_string(v); };
  for (const at::Tensor& scales : {up, down}) {
    expect_matches_ort(resize(x, {{"mode", s("linear")}, {"coordinate_transformation_mode", s("half_pixel")}}, scales));
    expect_matches_ort(
        resize(x, {{"mode", s("linear")}, {"coordinate_transformation_mode", s("align_corners")}}, scales));
    expect_matches_ort(resize(
        x, {{"mode", s("nearest")}, {"coordinate_transformation_mode", s("asymmetric")}, {"nearest_mode", s("floor")}},
        scales));
    expect_matches_ort(resize(x,
                              {{"mode", s("cubic")},
                               {"cubic_coeff_a", Attribute::of_float(-0.5)},
                               {"exclude_outside", Attribute::of_int(1)}},
                              scales),
                       1e-4);
  }
  expect_matches_ort(resize(x, {{"mode", s("nearest")}, {"nearest_mode", s("round_prefer_ceil")}}, {},
                            at::tensor({1, 2, 9, 4}, at::kLong)));
  expect_matches_ort(resize(x, {{"mode", s("linear")}, {"coordinate_transformation_mode", s("pytorch_half_pixel")}}, {},
                            at::tensor({1, 2, 1, 13}, at::kLong)));
}

}  // namespace
}  // namespace sparsebit::testing
