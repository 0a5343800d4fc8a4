// LSTM, GRU and RNN against ONNX Runtime: both directions, biases, initial states, sequence
// lengths shorter than the batch's, and the gate variants.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class RecurrentOps : public OrtOpTest {};

constexpr std::int64_t kSeq = 5, kBatch = 3, kIn = 4, kHidden = 6;

TEST_F(RecurrentOps, BidirectionalWithLengthsAndInitialStates) {
  const at::Tensor x = at::randn({kSeq, kBatch, kIn});
  const at::Tensor lengths = at::tensor({5, 3, 1}, at::kInt);
  const at::Tensor h0 = at::randn({2, kBatch, kHidden}) * 0.5;
  const auto hidden = Attribute::of_int(kHidden);
  const auto both = Attribute::of_string("bidirectional");
  expect_matches_ort({"LSTM",
                      "",
                      {{"hidden_size", hidden}, {"direction", both}},
                      {{"x", x},
                       {"w", at::randn({2, 4 * kHidden, kIn}) * 0.4},
                       {"r", at::randn({2, 4 * kHidden, kHidden}) * 0.4},
                       {"b", at::randn({2, 8 * kHidden}) * 0.2},
                       {"lengths", lengths},
                       {"h0", h0},
                       {"c0", at::randn({2, kBatch, kHidden}) * 0.5}},
                      {"y", "y_h", "y_c"}},
                     1e-5);
  for (std::int64_t before_reset : {0, 1})
    expect_matches_ort(
        {"GRU",
         "",
         {{"hidden_size", hidden}, {"direction", both}, {"linear_before_reset", Attribute::of_int(before_reset)}},
         {{"x", x},
          {"w", at::randn({2, 3 * kHidden, kIn}) * 0.4},
          {"r", at::randn({2, 3 * kHidden, kHidden}) * 0.4},
          {"b", at::randn({2, 6 * kHidden}) * 0.2},
          {"lengths", lengths},
          {"h0", h0}},
         {"y", "y_h"}},
        1e-5);
}

TEST_F(RecurrentOps, ReverseRnnWithClip) {
  expect_matches_ort({"RNN",
                      "",
                      {{"hidden_size", Attribute::of_int(kHidden)},
                       {"direction", Attribute::of_string("reverse")},
                       {"clip", Attribute::of_float(0.8)}},
                      {{"x", at::randn({kSeq, kBatch, kIn})},
                       {"w", at::randn({1, kHidden, kIn})},
                       {"r", at::randn({1, kHidden, kHidden})}},
                      {"y", "y_h"}},
                     1e-5);
}

}  // namespace
}  // namespace sparsebit::testing
