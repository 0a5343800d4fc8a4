// The signal ops against ONNX Runtime: real and complex DFTs both ways, the STFT with a window,
// the windows themselves and the mel filter bank.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class SignalOps : public OrtOpTest {};

TEST_F(SignalOps, DftForwardInverseAndStft) {
  const at::Tensor real = at::randn({2, 16, 1}), complex = at::randn({2, 12, 2});
  expect_matches_ort({"DFT", "", {{"axis", Attribute::of_int(1)}}, {{"x", real}}, {"y"}}, 1e-4);
  expect_matches_ort({"DFT", "", {{"onesided", Attribute::of_int(1)}}, {{"x", real}}, {"y"}}, 1e-4);
  expect_matches_ort({"DFT", "", {{"inverse", Attribute::of_int(1)}}, {{"x", complex}}, {"y"}}, 1e-4);
  expect_matches_ort({"DFT", "", {}, {{"x", real}, {"n", at::scalar_tensor(20, at::kLong)}}, {"y"}}, 1e-4);
  expect_matches_ort({"STFT",
                      "",
                      {{"onesided", Attribute::of_int(1)}},
                      {{"signal", at::randn({2, 64, 1})},
                       {"step", at::scalar_tensor(8, at::kLong)},
                       {"window", at::hann_window(16)},
                       {"length", at::scalar_tensor(16, at::kLong)}},
                      {"y"}},
                     1e-4);
}

TEST_F(SignalOps, WindowsAndMelFilters) {
  for (std::int64_t periodic : {0, 1})
    for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"})
      expect_matches_ort(
          {op, "", {{"periodic", Attribute::of_int(periodic)}}, {{"size", at::scalar_tensor(10, at::kLong)}}, {"y"}},
          1e-6);
  expect_matches_ort({"MelWeightMatrix",
                      "",
                      {},
                      {{"bins", at::scalar_tensor(8, at::kLong)},
                       {"dft", at::scalar_tensor(64, at::kLong)},
                       {"rate", at::scalar_tensor(16000, at::kLong)},
                       {"lo", at::scalar_tensor(20.0)},
                       {"hi", at::scalar_tensor(7600.0)}},
                      {"y"}},
                     1e-5);
}

}  // namespace
}  // namespace sparsebit::testing
