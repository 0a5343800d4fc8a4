// kl_histogram against the published algorithm on a fixed histogram (numpy).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Observers, KlMatchesTheTensorRTAlgorithmOnAFixedHistogram) {
  // One observe call: the histogram spans exactly [-max|x|, max|x|] in 4096 bins, the same bins
  // the reference builds, so the threshold must agree exactly.
  expect_scale_near(observe_exact("kl_histogram"), reference().expected("kl_histogram", symmetric8(true)), 1e-6, "kl");
  // Streaming: the range doubled while batches arrived, so bins are coarser; still close.
  expect_scale_near(observe_streaming("kl_histogram"), reference().expected("kl_histogram", symmetric8(false)), 5e-2,
                    "kl streaming");
  // KL clips the outliers that minmax keeps.
  EXPECT_LT(observe_exact("kl_histogram").scale.item<double>(), observe_exact("minmax").scale.item<double>() * 0.6);
}

}  // namespace
}  // namespace sparsebit::testing
