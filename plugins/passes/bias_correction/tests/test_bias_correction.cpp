// Bias correction: the mean output error it removes, measured independently.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "reconstruction_testing.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::testing {
namespace {

TEST(BiasCorrection, RemovesTheMeanOutputErrorOfEachChannel) {
  const Builder b = single_conv(21);
  at::manual_seed(22);
  // Inputs with a non-zero mean, so weight rounding errors bias the output.
  const std::vector<at::Tensor> calib = {at::randn({8, 8, 10, 10}) + 1, at::randn({8, 8, 10, 10}) + 1};
  const char* per_tensor = "[w]\nqscheme = \"per-tensor-symmetric\"\nbits = 4\n[a]\ndisable = true\n";
  auto config = [&](bool correct) {
    return Config::from_string(
        std::string("backend = \"virtual\"\n") + per_tensor +
            "[calibration]\nmode = \"layerwise\"\n[schedule]\nbias_correction = " + (correct ? "true" : "false") + "\n",
        "bc.toml");
  };
  auto plain = calibrate(b.g, config(false), calib);
  auto corrected = calibrate(b.g, config(true), calib);
  ASSERT_EQ(corrected.stats.layer_pass_changes.size(), 1u);
  EXPECT_EQ(corrected.stats.layer_pass_changes[0], "bias_correction: conv");
  const at::Tensor all = at::cat(calib);
  const at::Tensor before = mean_error_per_channel(plain.qm, all);
  // The float model is unchanged by correction except for the bias, so compare against the
  // original float outputs: quantized(corrected) - float(original).
  c10::NoGradGuard g;
  plain.qm.set_quant(false, false);
  const at::Tensor ref = plain.qm.forward({all})[0];
  corrected.qm.set_quant(true, true);
  const at::Tensor q = corrected.qm.forward({all})[0];
  const at::Tensor after = (ref - q).transpose(0, 1).reshape({16, -1}).mean(1);
  std::printf("largest per-channel mean output error: %.4g before bias correction, %.4g after\n",
              before.abs().max().item<double>(), after.abs().max().item<double>());
  EXPECT_GT(before.abs().max().item<double>(), 1e-2);
  EXPECT_LT(after.abs().max().item<double>(), 1e-5);
  // The bias moved by exactly the measured error, in the model that export writes.
  const at::Tensor shift = corrected.qm.graph().initializers.at("bias") - b.g.initializers.at("bias");
  EXPECT_TRUE(at::allclose(shift, before.to(at::kFloat), 1e-4, 1e-6));
}

TEST(BiasCorrection, NeedsALayerwiseMode) {
  const Builder b = single_conv(1);
  const std::string msg = error_of([&] {
    calibrate(b.g, Config::from_string("[schedule]\nbias_correction = true\n", "bc.toml"), {at::randn({2, 8, 10, 10})});
  });
  EXPECT_NE(msg.find("bias_correction"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layerwise"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparsebit::testing
