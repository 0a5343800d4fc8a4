// mse against the grid-search reference (numpy).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Observers, MseMatchesTheGridSearchReference) {
  expect_scale_near(observe_exact("mse"), reference().expected("mse", symmetric8(true)), 1e-6, "mse exact");
  expect_scale_near(observe_streaming("mse"), reference().expected("mse", symmetric8(false)), 2e-2, "mse streaming");
}

}  // namespace
}  // namespace sparsebit::testing
