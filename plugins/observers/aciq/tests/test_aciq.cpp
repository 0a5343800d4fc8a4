// aciq against its formulas (numpy and by hand).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sparsebit::testing
