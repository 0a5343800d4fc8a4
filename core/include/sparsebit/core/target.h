#pragma once
/// \file
/// The accuracy target (`sparsebit quantize --target "cosine>=0.99"`, or a `[target]` table):
/// after calibration the quantized model is measured against the float one on samples it was
/// not calibrated on; when it falls short, the layers whose quantization alone hurts most move
/// to a fallback precision until the target holds or the budget is spent.
///
/// Note [Accuracy target]
///   1. Metric, over every floating-point graph output, one held-out sample at a time:
///        cosine     the worst sample's cosine similarity to the float output
///        sqnr       10 log10(sum f^2 / sum (q - f)^2) over all samples, in dB
///        mse        mean of (q - f)^2 over all elements
///        top1-drop  FP32 minus simulated top-1 accuracy on --eval-data/--eval-labels, in points
///   2. Sensitivity, computed once: each layer (a node with quantized inputs) quantized alone,
///      the error power at the outputs relative to the signal (shown as SQNR). The float values
///      of each held-out sample are cached once; a layer's run recomputes only the nodes that
///      depend on it.
///   3. Search, for each fallback precision in order ("int16": the layer's activations on 16
///      bits, weights as calibrated; "float": the layer unquantized): the K most sensitive
///      layers that can take it (K = the budget) are moved; if the target then holds, bisection
///      over the ranked list finds the fewest that still hold it (about log2 K evaluations,
///      trusting that moving more layers never hurts). The first precision that reaches the
///      target wins; if none does, the configuration with the best metric is kept and the
///      report says the target was missed.
/// Deterministic: data in file order, ties in sensitivity broken by graph order. 16-bit
/// activations export as int16/uint16 Q/DQ at opset 21; float layers export with no Q/DQ.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {

/// One layer's sensitivity: the error at the outputs with only this layer quantized.
struct LayerSensitivity {
  std::string node, op_type;
  double sqnr_db = 0;  ///< higher is better; the ranking's worst first
};

struct TargetReport {
  std::string target;       ///< "cosine>=0.99"
  std::string measured_on;  ///< what the metric was measured on
  std::int64_t samples = 0;
  double before = 0, after = 0;  ///< the metric with every layer quantized, and as exported
  bool reached = false;
  std::string precision;                          ///< the fallback precision used ("" when none was needed)
  std::vector<LayerSensitivity> fallback_layers;  ///< the layers moved, most sensitive first
  std::size_t quantized_layers = 0, budget = 0;
  int evaluations = 0;  ///< whole-model measurements of a configuration
  double sensitivity_seconds = 0, seconds = 0;
  std::vector<LayerSensitivity> ranking;  ///< every quantized layer, most sensitive first
};

struct TargetData {
  /// Held-out samples, one per entry (batch dimension 1), one tensor per graph input.
  std::vector<std::vector<at::Tensor>> holdout;
  std::string holdout_description;
  /// Calibration data again, for the observers of 16-bit activations (the same samples the
  /// model was calibrated on).
  std::function<std::unique_ptr<Dataset>()> calibration;
  /// top1-drop: evaluation batches and one label per sample.
  std::vector<std::vector<at::Tensor>> eval;
  at::Tensor eval_labels;
  std::string eval_description;
};

/// Meets `target` on a calibrated model (Note [Accuracy target]); the model is left in the
/// chosen configuration with quantization off. `progress` counts sensitivity layers.
SPARSEBIT_API TargetReport meet_target(QuantModel& qm, const TargetConfig& target, const TargetData& data,
                                       const ProgressFn& progress = {});

/// The report as JSON text (the "target" of `sparsebit quantize --report`).
SPARSEBIT_API std::string target_report_json(const TargetReport& r);

}  // namespace sparsebit
