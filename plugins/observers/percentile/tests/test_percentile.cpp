// percentile against exact order statistics (numpy) and by hand.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Observers, PercentileMatchesExactOrderStatistics) {
  for (double alpha : {1e-3, 1e-2}) {
    Options o("[test]");
    o.set("alpha", alpha);
    const std::string key = alpha == 1e-3 ? "percentile_1e-3" : "percentile_1e-2";
    expect_scale_near(observe_exact("percentile", o), reference().expected(key, symmetric8(true)), 1e-6,
                      key + " exact");
    expect_scale_near(observe_streaming("percentile", o), reference().expected(key, symmetric8(false)), 5e-3,
                      key + " streaming");
  }
  // By hand: -1.000 .. 1.000 in steps of 0.001 (1000 negative, 1001 non-negative), alpha 1e-2:
  // the 10th smallest is -0.991, the 11th largest is 0.990.
  Options o("[test]");
  o.set("alpha", 1e-2);
  auto obs = make_observer("percentile", symmetric8(true), o);
  obs->observe(at::arange(-1000, 1001, at::kDouble).div(1000).to(at::kFloat));
  EXPECT_FLOAT_EQ(obs->compute().scale.item<float>(), static_cast<float>(2 * 0.991 / 255));
}

}  // namespace
}  // namespace sparsebit::testing
