// moving_average by hand.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sparsebit/sdk/testing.h"

namespace sparsebit::testing {
namespace {

// The plugin these tests are for, as built (Note [Plugin test kit]).
const PluginUnderTest& plugin() {
  static const PluginUnderTest built(SPARSEBIT_PLUGIN_FILE);
  return built;
}

TEST(Observers, MovingAverageByHand) {
  QSpec aff;
  aff.symmetric = false;
  auto obs = plugin().observer("moving_average", aff);
  obs->observe(at::tensor({-1.0f, 2.0f}));
  obs->observe(at::tensor({-3.0f, 1.0f}));
  // min = 0.9 * -1 + 0.1 * -3 = -1.2; max = 0.9 * 2 + 0.1 * 1 = 1.9
  QParams p = obs->compute();
  EXPECT_NEAR(p.scale.item<double>(), 3.1 / 255, 1e-7);
  EXPECT_EQ(p.zero_point.item<int>(), 99);  // round(1.2 / (3.1/255)) = round(98.71)
  Options o("[test]");
  o.set("ema_ratio", 1.5);
  EXPECT_THROW(plugin().observer("moving_average", aff, o), Error);
}

}  // namespace
}  // namespace sparsebit::testing
