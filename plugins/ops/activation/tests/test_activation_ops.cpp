// The activation ops against ONNX Runtime, each alone in a model, with the attributes that
// change their formula set away from the defaults.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class ActivationOps : public OrtOpTest {};

TEST_F(ActivationOps, PointwiseWithTheirAttributes) {
  const at::Tensor x = at::randn({2, 3, 4, 5}) * 3;
  const auto f = [](double v) { return Attribute::of_float(v); };
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Selu", "Softplus", "Softsign", "HardSwish"})
    expect_matches_ort({op, "", {}, {{"x", x}}, {"y"}});
  expect_matches_ort({"Mish", "", {}, {{"x", x}}, {"y"}, 18});
  expect_matches_ort({"HardSigmoid", "", {{"alpha", f(0.3)}, {"beta", f(0.4)}}, {{"x", x}}, {"y"}});
  expect_matches_ort({"LeakyRelu", "", {{"alpha", f(0.2)}}, {{"x", x}}, {"y"}});
  expect_matches_ort({"Elu", "", {{"alpha", f(0.7)}}, {{"x", x}}, {"y"}});
  expect_matches_ort({"Celu", "", {{"alpha", f(1.5)}}, {{"x", x}}, {"y"}});
  expect_matches_ort({"ThresholdedRelu", "", {{"alpha", f(0.8)}}, {{"x", x}}, {"y"}});
  expect_matches_ort({"Shrink", "", {{"bias", f(0.5)}, {"lambd", f(1.2)}}, {{"x", x}}, {"y"}});
  expect_matches_ort({"Gelu", "", {}, {{"x", x}}, {"y"}, 20});
  expect_matches_ort({"Gelu", "", {{"approximate", Attribute::of_string("tanh")}}, {{"x", x}}, {"y"}, 20});
}

TEST_F(ActivationOps, BroadcastSlopesBoundsAndAxes) {
  const at::Tensor x = at::randn({2, 3, 4, 5}) * 3;
  expect_matches_ort({"PRelu", "", {}, {{"x", x}, {"slope", at::rand({3, 1, 1})}}, {"y"}});
  expect_matches_ort(
      {"Clip", "", {}, {{"x", x}, {"lo", at::scalar_tensor(-1.5)}, {"hi", at::scalar_tensor(0.7)}}, {"y"}});
  expect_matches_ort({"Clip", "", {}, {{"x", x}, {"", {}}, {"hi", at::scalar_tensor(0.7)}}, {"y"}});
  for (std::int64_t axis : {1, -1}) {
    const auto a = Attribute::of_int(axis);
    expect_matches_ort({"Softmax", "", {{"axis", a}}, {{"x", x}}, {"y"}});
    expect_matches_ort({"LogSoftmax", "", {{"axis", a}}, {{"x", x}}, {"y"}});
    expect_matches_ort({"Hardmax", "", {{"axis", a}}, {{"x", x}}, {"y"}});
  }
}

}  // namespace
}  // namespace sparsebit::testing
