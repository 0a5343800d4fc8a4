#pragma once
// Helpers for the layerwise runner's tests and the layer-wise plugins' tests (adaround,
// bias_correction): small conv models, configs, calibration from tensors, output errors.

#include <ATen/ATen.h>
#include <ATen/ops/upsample_bilinear2d.h>
#include <c10/core/GradMode.h>

#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"
#include "test_support.h"

namespace sparsebit::testing {

/// x -> Conv(8 -> 16, 3x3) -> y, random weights with a bias; calibration data in `dir`.
inline Builder single_conv(std::int64_t seed) {
  at::manual_seed(seed);
  Builder b({8, 8, 10, 10});
  b.constant("w", at::randn({16, 8, 3, 3}) * 0.2);
  b.constant("bias", at::randn({16}) * 0.1);
  b.add("conv", "Conv", {"x", "w", "bias"}, {"y"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  return b;
}

inline Config w4_config(const std::string& quantizer, const std::string& mode, const std::string& extra = "") {
  return Config::from_string(
      "backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\nbits = 4\nquantizer = \"" + quantizer + "\"\n" +
          extra + "[a]\nqscheme = \"per-tensor-affine\"\nbits = 8\n" + "[calibration]\nbatch_size = 16\nmode = \"" +
          mode + "\"\n",
      "w4.toml");
}

inline const char* kFewIterations = "[w.quantizer_options]\niterations = 1000\nbatch_size = 8\nlearning_rate = 1e-2\n";

struct Calibrated {
  QuantModel qm;
  CalibrationStats stats;
};

inline Calibrated calibrate(const Graph& g, const Config& c, const std::vector<at::Tensor>& batches) {
  QuantModel qm(Model{g.clone(), ModelMeta{}}, c, shipped_registry());
  TempDir dir;
  for (std::size_t i = 0; i < batches.size(); ++i) write_npy(batches[i], dir / ("x" + std::to_string(i) + ".npy"));
  auto data = open_dataset(dir.path().string(), qm.graph().inputs);
  CalibrationStats stats = qm.calibrate(*data);
  return {std::move(qm), stats};
}

inline double output_mse(QuantModel& qm, const at::Tensor& x) {
  c10::NoGradGuard g;
  qm.set_quant(false, false);
  const at::Tensor ref = qm.forward({x})[0];
  qm.set_quant(true, true);
  const double mse = (qm.forward({x})[0] - ref).pow(2).mean().item<double>();
  qm.set_quant(false, false);
  return mse;
}

/// Inputs like a real layer's: 8 channels mixed from 3 latent ones, spatially smooth. (With
/// independent inputs the output error's Hessian is diagonal and rounding to nearest is already
/// optimal; AdaRound gains from the correlations real data has.)
inline at::Tensor correlated_inputs(std::int64_t n, const at::Tensor& mix) {
  const at::Tensor z = at::upsample_bilinear2d(at::randn({n, 3, 5, 5}), {10, 10}, false);
  return at::einsum("ck,nkhw->nchw", {mix, z}) + 0.05 * at::randn({n, 8, 10, 10});
}

/// A chain of `layers` Conv+Relu blocks (8 channels, 6x6).
inline Builder conv_chain(int layers) {
  at::manual_seed(11);
  Builder b({4, 8, 6, 6});
  std::string x = "x";
  for (int i = 0; i < layers; ++i) {
    const std::string w = "w" + std::to_string(i), c = "c" + std::to_string(i);
    const std::string r = i + 1 == layers ? "y" : "r" + std::to_string(i);
    b.constant(w, at::randn({8, 8, 3, 3}) * 0.25);
    b.add("conv" + std::to_string(i), "Conv", {x, w}, {c}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
    b.add("relu" + std::to_string(i), "Relu", {c}, {r});
    x = r;
  }
  return b;
}

/// Mean of (float - quantized) output per channel (axis 1) over `x`.
inline at::Tensor mean_error_per_channel(QuantModel& qm, const at::Tensor& x) {
  c10::NoGradGuard g;
  qm.set_quant(false, false);
  const at::Tensor ref = qm.forward({x})[0];
  qm.set_quant(true, true);
  const at::Tensor q = qm.forward({x})[0];
  qm.set_quant(false, false);
  return (ref - q).transpose(0, 1).reshape({ref.size(1), -1}).mean(1);
}

}  // namespace sparsebit::testing
