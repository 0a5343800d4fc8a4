// aciq against its formulas (numpy and by hand).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Observers, AciqMatchesItsFormulas) {
  Options laplace("[test]");
  laplace.set("distribution", std::string("laplace"));
  expect_scale_near(observe_exact("aciq", laplace), reference().expected("aciq_laplace", symmetric8(true)), 1e-5,
                    "laplace");
  expect_scale_near(observe_streaming("aciq", laplace), reference().expected("aciq_laplace", symmetric8(false)), 1e-2,
                    "laplace streaming");
  Options gaus("[test]");
  gaus.set("distribution", std::string("gaus"));
  expect_scale_near(observe_exact("aciq", gaus), reference().expected("aciq_gaus", symmetric8(true)), 1e-5, "gaus");
  QSpec four = symmetric8(true);
  four.bits = 4;
  auto obs = make_observer("aciq", four, laplace);
  obs->observe(reference().data);
  QParams want =
      qparams_from_range(at::scalar_tensor(reference().values["aciq_laplace_4bit"][0].get<double>()),
                         at::scalar_tensor(reference().values["aciq_laplace_4bit"][1].get<double>()), four, "4bit");
  expect_scale_near(obs->compute(), want, 1e-5, "laplace 4-bit");
  // By hand, Gaussian: values -1, -0.5, 0, 0.5, 1 (N = 5):
  // sigma = 2 * 0.175 * (1 + sqrt(pi ln 4)) / sqrt(2 ln 5); clip = 3.92 sigma = 2.3605...
  auto g = make_observer("aciq", symmetric8(true), gaus);
  g->observe(at::tensor({-1.0f, -0.5f, 0.0f, 0.5f, 1.0f}));
  EXPECT_NEAR(g->compute().scale.item<double>(), 2 * 2.3605261 / 255, 1e-6);
  Options bad("[test]");
  bad.set("distribution", std::string("cauchy"));
  EXPECT_THROW(make_observer("aciq", symmetric8(true), bad), Error);
}

// Activations of PP-OCRv4's recognizer (observer_testing.h): the Gaussian formula, by hand,
// clips more than 1% of the values of one of them (with it the recognizer's exact-match was 0%);
// the observer's threshold is the formula's raised to the clipping floor (Note [Clipping floor]).
TEST(Observers, AciqKeepsTheClippingFloorOnARealRecognizersActivations) {
  bool beyond_floor = false;
  for (const auto& [what, x] : real_activations()) {
    const std::int64_t per_sample = x.numel() / 16;
    // sigma from the range of N values per sample (the 16 chunks below), clip = 3.92 sigma.
    const double range = (x.max() - x.min()).item<double>();
    const double formula =
        3.92 * range * 0.175 * (1 + std::sqrt(M_PI * std::log(4.0))) / std::sqrt(2 * std::log(double(per_sample)));
    const double clipped = (x.abs() > formula).to(at::kDouble).mean().item<double>();
    beyond_floor = beyond_floor || clipped > 1e-2;
    auto obs = make_observer("aciq", symmetric8(false));
    for (const auto& chunk : x.chunk(16)) obs->observe(chunk.reshape({1, -1}));
    const double t = obs->compute().scale.item<double>() * 127.5;
    EXPECT_NEAR(t, std::max(formula, clipping_floor(x)), 2 * x.abs().max().item<double>() / 2048) << what;
  }
  EXPECT_TRUE(beyond_floor);
}

}  // namespace
}  // namespace sparsebit::testing
