// The math ops against ONNX Runtime: reductions with axes as attribute and as input, scans,
// contractions, selections and integer arithmetic whose sign rules differ between ops.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class MathOps : public OrtOpTest {};

at::Tensor i64(std::vector<std::int64_t> v) { return at::tensor(v, at::kLong); }

TEST_F(MathOps, ReductionsKeepOrDropTheirAxes) {
  const at::Tensor x = at::rand({3, 4, 5}) + 0.1;
  for (std::int64_t keep : {0, 1}) {
    const auto k = Attribute::of_int(keep);
    expect_matches_ort({"ReduceSum", "", {{"keepdims", k}}, {{"x", x}, {"axes", i64({0, -1})}}, {"y"}});
    for (const char* op : {"ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp", "ReduceProd", "ReduceSumSquare"})
      expect_matches_ort({op, "", {{"keepdims", k}, {"axes", Attribute::of_ints({1})}}, {{"x", x}}, {"y"}});
  }
  expect_matches_ort({"ReduceSum", "", {{"noop_with_empty_axes", Attribute::of_int(1)}}, {{"x", x}}, {"y"}});
}

// sqrt(300^2 + 400^2) = 500 by hand: the squares overflow float16 (largest 65504), the norm does not.
TEST(MathOpsHalf, ReduceL2OfFloat16SquaresInAWiderType) {
  Graph g =
      single_node({"ReduceL2", "", {{"keepdims", Attribute::of_int(0)}}, {{"x", at::zeros({2}, at::kHalf)}}, {"y"}});
  g.outputs[0].elem_type = 0;
  Executor ours(g, shipped_registry());
  const at::Tensor y = ours.run({{"x", at::tensor({300.0f, -400.0f}).to(at::kHalf)}})[0];
  EXPECT_EQ(y.scalar_type(), at::kHalf);
  EXPECT_EQ(y.item<float>(), 500.0f);
}

TEST_F(MathOps, ScansContractionsAndSelections) {
  const at::Tensor x = at::randn({3, 4, 5});
  for (std::int64_t exclusive : {0, 1})
    for (std::int64_t reverse : {0, 1})
      expect_matches_ort({"CumSum",
                          "",
                          {{"exclusive", Attribute::of_int(exclusive)}, {"reverse", Attribute::of_int(reverse)}},
                          {{"x", x}, {"axis", at::scalar_tensor(1, at::kLong)}},
                          {"y"}});
  expect_matches_ort({"Einsum",
                      "",
                      {{"equation", Attribute::of_string("bij,bjk->bik")}},
                      {{"a", x}, {"b", at::randn({3, 5, 2})}},
                      {"y"}});
  expect_matches_ort({"Einsum", "", {{"equation", Attribute::of_string("...ij->...ji")}}, {{"a", x}}, {"y"}});
  expect_matches_ort({"TopK",
                      "",
                      {{"axis", Attribute::of_int(-1)}, {"largest", Attribute::of_int(0)}},
                      {{"x", x}, {"k", i64({3})}},
                      {"values", "indices"}});
  const at::Tensor ties = at::tensor({1.0f, 3.0f, 3.0f, 0.0f, 2.0f, 2.0f}).reshape({2, 3});
  expect_matches_ort({"ArgMax",
                      "",
                      {{"axis", Attribute::of_int(1)}, {"select_last_index", Attribute::of_int(1)}},
                      {{"x", ties}},
                      {"y"}});
  expect_matches_ort(
      {"ArgMin", "", {{"axis", Attribute::of_int(0)}, {"keepdims", Attribute::of_int(0)}}, {{"x", ties}}, {"y"}});
  expect_matches_ort({"Where", "", {}, {{"c", x > 0}, {"a", x}, {"b", at::randn({5})}}, {"y"}});
  expect_matches_ort({"Det", "", {}, {{"x", at::randn({2, 3, 3})}}, {"y"}}, 1e-4);
}

// Integer Mod takes the divisor's sign (fmod = 0) or the dividend's (fmod = 1); Round takes
// halves to even; Pow broadcasts its exponent.
TEST_F(MathOps, SignRulesOfIntegerAndRoundingOps) {
  const at::Tensor a = i64({-7, 7, -7, 7, 5, -5}), b = i64({3, -3, -3, 3, 2, 2});
  expect_matches_ort({"Mod", "", {}, {{"a", a}, {"b", b}}, {"y"}}, 0);
  expect_matches_ort({"Mod", "", {{"fmod", Attribute::of_int(1)}}, {{"a", a}, {"b", b}}, {"y"}}, 0);
  expect_matches_ort(
      {"Mod", "", {{"fmod", Attribute::of_int(1)}}, {{"a", at::randn({6}) * 5}, {"b", at::rand({6}) + 1}}, {"y"}});
  expect_matches_ort({"Round", "", {}, {{"x", at::tensor({-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 2.4f})}}, {"y"}}, 0);
  expect_matches_ort({"Pow", "", {}, {{"x", at::rand({2, 3}) + 0.5}, {"e", at::tensor({2.0f, 0.5f, -1.0f})}}, {"y"}});
}

}  // namespace
}  // namespace sparsebit::testing
