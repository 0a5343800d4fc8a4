// bias_correction (layer stage): empirical bias correction (Nagel et al., "Data-Free
// Quantization Through Weight Equalization and Bias Correction", 2019, section 4.2, with the
// expectation taken on calibration data). For each node with a constant bias (Conv,
// ConvTranspose, Gemm), the mean over the calibration data of (float output - quantized output),
// per output channel, is added to the bias, so the quantized layer's output is unbiased.
// Works with any quantizer; runs in the layerwise runner after the node's quantizers are set
// (after AdaRound's reconstruction, on its final rounding). In "asym" mode the quantized output
// comes from the quantized model's own inputs, so each layer also absorbs the mean error of
// the layers before it. Nodes without a bias are left as they are (fuse_bn gives convolutions
// followed by BatchNormalization one).

#include <ATen/ATen.h>

#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

/// Sum of x over every axis but `axis`, as a vector along it.
at::Tensor channel_sums(const at::Tensor& x, std::int64_t axis) {
  return x.transpose(0, axis).reshape({x.size(axis), -1}).sum(1, /*keepdim=*/false, at::kDouble);
}

class BiasCorrection final : public Pass {
 public:
  Stage stage() const override { return Stage::kLayer; }

  bool run_layer(LayerState& state, const PassContext&) override {
    const int k = state.bias_input();
    if (k < 0) {
      if (state.node().op_type == "Conv" || state.node().op_type == "ConvTranspose" || state.node().op_type == "Gemm")
        sdk::log_debug(state.node().describe() + ": no constant bias, not corrected");
      return false;
    }
    const std::int64_t axis = state.bias_axis();
    at::Tensor sum;
    double count = 0;
    for (std::size_t b = 0; b < state.batches(); ++b) {
      const at::Tensor f = state.float_output(b);
      const at::Tensor q = state.quantized_output(b);
      const at::Tensor s = channel_sums(f - q, axis);
      sum = sum.defined() ? sum + s : s;
      count += static_cast<double>(f.numel()) / static_cast<double>(f.size(axis));
    }
    if (!sum.defined() || count == 0) return false;
    const at::Tensor shift = sum / count;
    if (shift.abs().max().item<double>() == 0) return false;  // nothing quantized here
    const at::Tensor& bias = state.graph().initializers.at(state.node().inputs[static_cast<std::size_t>(k)]);
    state.set_bias(bias + shift.to(at::kCPU, bias.scalar_type()));
    sdk::log_debug(state.node().describe() + ": bias corrected by up to " +
                   std::to_string(shift.abs().max().item<double>()));
    return true;
  }
};

void register_all(Registrar& r) { r.add_pass<BiasCorrection>("bias_correction", PassSchedule{2100, false}); }

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.bias_correction", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
