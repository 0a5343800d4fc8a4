// Note [Relative layer error]: the per-slice squared errors the range selection and the accuracy
// target compare, against the same sums written with ATen ops in double: contiguous and
// channels-last outputs (vector loops and their tails), tensors of rank 1 to 3, NaN and Inf
// (counted as 0), and the float energy alone.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "quant/layer_error.h"

namespace sparsebit::detail {
namespace {

at::Tensor by_formula(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = slices((b.defined() ? a.to(at::kDouble) - b.to(at::kDouble) : a.to(at::kDouble)));
  const at::Tensor finite = at::isfinite(d);
  const at::Tensor z = at::where(finite, d, at::zeros_like(d));
  return (z * z).sum(at::IntArrayRef{0, 2});
}

TEST(LayerError, SliceSquaresAreTheSumsOfSquaredDifferencesPerSlice) {
  at::manual_seed(5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& shape :
       std::vector<std::vector<std::int64_t>>{{2, 19, 3, 5}, {3, 8, 30, 20}, {2, 40, 700}, {1300}, {6, 5}}) {
    for (bool channels_last : {false, true}) {
      if (channels_last && shape.size() != 4) continue;
      at::Tensor a = at::randn(shape), b = at::randn(shape);
      a.view({-1})[7] = nan;
      b.view({-1})[11] = inf;
      a.view({-1})[13] = inf;
      b.view({-1})[13] = inf;  // Inf - Inf
      if (channels_last) {
        a = a.contiguous(at::MemoryFormat::ChannelsLast);
        b = b.contiguous(at::MemoryFormat::ChannelsLast);
      }
      const at::Tensor err = slice_error(a, b), want = by_formula(a, b);
      ASSERT_EQ(err.sizes(), want.sizes());
      EXPECT_TRUE(at::allclose(err, want, 1e-5, 0)) << c10::str(shape) << (channels_last ? " channels last" : "");
      const Reference r = reference_of({a});
      EXPECT_TRUE(at::allclose(r.energy[0], by_formula(a, at::Tensor()), 1e-5, 0)) << c10::str(shape);
    }
  }
}

}  // namespace
}  // namespace sparsebit::detail
