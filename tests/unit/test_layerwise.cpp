// The asym layerwise runner releases cached values of both streams as it goes.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "reconstruction_testing.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::testing {
namespace {

TEST(Layerwise, AsymRunnerReleasesBothStreamsAsItGoes) {
  at::manual_seed(12);
  std::vector<at::Tensor> calib;
  for (int i = 0; i < 5; ++i) calib.push_back(at::randn({4, 8, 6, 6}));
  const std::int64_t batch_bytes = 4 * 8 * 6 * 6 * 4;
  for (int layers : {3, 12}) {
    const Builder b = conv_chain(layers);
    const char* few = "[w.quantizer_options]\niterations = 2\n";
    auto asym = calibrate(b.g, w4_config("adaround", "asym", few), calib);
    auto lw = calibrate(b.g, w4_config("adaround", "layerwise", few), calib);
    EXPECT_EQ(asym.stats.reconstructions.size(), static_cast<std::size_t>(layers));
    // Per batch at most one input and one output of the current node in each stream, however
    // deep the chain (without release: 2 x layers values per batch and stream).
    EXPECT_LE(asym.stats.peak_cached_tensors, 4u * calib.size()) << layers << " layers";
    EXPECT_LE(asym.stats.peak_cached_bytes, 4 * batch_bytes * std::int64_t(calib.size())) << layers << " layers";
    EXPECT_LE(lw.stats.peak_cached_tensors, 2u * calib.size()) << layers << " layers";
    EXPECT_LE(lw.stats.peak_cached_bytes, 2 * batch_bytes * std::int64_t(calib.size())) << layers << " layers";
    // The quantized stream is real: deeper activation observers saw different data in asym mode.
    const auto& s_asym = asym.qm.slots();
    const auto& s_lw = lw.qm.slots();
    bool differs = false;
    for (std::size_t i = 0; i < s_asym.size(); ++i)
      if (s_asym[i].role == InputRole::kActivation && s_asym[i].calibrated && s_asym[i].node_name != "conv0")
        differs = differs || !at::equal(s_asym[i].quantizer->qparams().scale, s_lw[i].quantizer->qparams().scale);
    EXPECT_TRUE(differs);
  }
}

}  // namespace
}  // namespace sparsebit::testing
