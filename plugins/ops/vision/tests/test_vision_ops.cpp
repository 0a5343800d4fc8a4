// The detection and sampling ops against ONNX Runtime: GridSample in each mode and padding,
// RoiAlign in both coordinate conventions, NonMaxSuppression per class, and MaxUnpool fed by
// MaxPool's indices.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class VisionOps : public OrtOpTest {};

TEST_F(VisionOps, GridSampleAndRoiAlign) {
  const at::Tensor x = at::randn({2, 3, 6, 7}), grid = at::rand({2, 4, 5, 2}) * 2.4 - 1.2;
  for (const char* mode : {"bilinear", "nearest", "bicubic"})
    for (const char* padding : {"zeros", "border", "reflection"})
      for (std::int64_t corners : {0, 1})
        expect_matches_ort({"GridSample",
                            "",
                            {{"mode", Attribute::of_string(mode)},
                             {"padding_mode", Attribute::of_string(padding)},
                             {"align_corners", Attribute::of_int(corners)}},
                            {{"x", x}, {"grid", grid}},
                            {"y"},
                            16},
                           1e-4);
  const at::Tensor rois =
      at::tensor({0.5f, 1.0f, 5.5f, 4.0f, 2.0f, 0.0f, 6.0f, 5.5f, 0.0f, 0.0f, 3.0f, 3.0f}).reshape({3, 4});
  for (const char* transform : {"half_pixel", "output_half_pixel"})
    for (const char* mode : {"avg", "max"})
      expect_matches_ort({"RoiAlign",
                          "",
                          {{"coordinate_transformation_mode", Attribute::of_string(transform)},
                           {"mode", Attribute::of_string(mode)},
                           {"output_height", Attribute::of_int(3)},
                           {"output_width", Attribute::of_int(2)},
                           {"sampling_ratio", Attribute::of_int(2)},
                           {"spatial_scale", Attribute::of_float(0.8)}},
                          {{"x", x}, {"rois", rois}, {"batch", at::tensor({0, 1, 1}, at::kLong)}},
                          {"y"},
                          16},
                         1e-4);
}

TEST_F(VisionOps, NonMaxSuppressionAndMaxUnpool) {
  const at::Tensor corners = at::rand({1, 20, 2}) * 10;
  const at::Tensor boxes = at::cat({corners, corners + at::rand({1, 20, 2}) * 6 + 1}, 2);
  for (std::int64_t center : {0, 1})
    expect_matches_ort({"NonMaxSuppression",
                        "",
                        {{"center_point_box", Attribute::of_int(center)}},
                        {{"boxes", boxes},
                         {"scores", at::rand({1, 2, 20})},
                         {"max", at::tensor({5}, at::kLong)},
                         {"iou", at::tensor({0.4f})},
                         {"score", at::tensor({0.2f})}},
                        {"selected"}},
                       0);
  Graph g;
  g.opset_imports[""] = 17;
  const at::Tensor x = at::randn({1, 2, 6, 6});
  g.inputs = {value_of("x", &x)};
  const auto two = Attribute::of_ints({2, 2});
  g.append(make_node("pool", "MaxPool", {"x"}, {"p", "i"}, {{"kernel_shape", two}, {"strides", two}}));
  g.append(make_node("unpool", "MaxUnpool", {"p", "i"}, {"y"}, {{"kernel_shape", two}, {"strides", two}}));
  g.outputs = {value_of("y"), value_of("i")};
  expect_graph_matches_ort(std::move(g), {{"x", x}}, "MaxPool -> MaxUnpool", 0);
}

}  // namespace
}  // namespace sparsebit::testing
