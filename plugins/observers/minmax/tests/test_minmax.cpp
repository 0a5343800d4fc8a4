// minmax by hand, per tensor and per channel.

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

TEST(Observers, MinMaxByHandPerTensorAndPerChannel) {
  QSpec aff;
  aff.symmetric = false;
  auto obs = plugin().observer("minmax", aff);
  obs->observe(at::tensor({-1.0f, 0.5f}));
  obs->observe(at::tensor({2.0f, -0.25f}));
  QParams p = obs->compute();
  EXPECT_FLOAT_EQ(p.scale.item<float>(), 3.0f / 255);
  EXPECT_EQ(p.zero_point.item<int>(), 85);  // round(1 / (3/255))
  QSpec pc;                                 // 8-bit symmetric
  pc.is_weight = true;
  pc.per_channel = true;
  pc.channel_axis = 1;
  auto w = plugin().observer("minmax", pc);
  w->observe(at::tensor({1.0f, -4.0f, -2.0f, 0.5f}).reshape({2, 2}));
  p = w->compute();
  EXPECT_FLOAT_EQ(p.scale[0].item<float>(), 2 * 2.0f / 255);
  EXPECT_FLOAT_EQ(p.scale[1].item<float>(), 2 * 4.0f / 255);
}

}  // namespace
}  // namespace sparsebit::testing
