#pragma once
/// \file
/// The accuracy target (`sparsebit quantize --target "cosine>=0.99"`, or a `[target]` table):
/// after calibration the quantized model is measured against the float one on samples it was
/// not calibrated on; when it falls short, the layers whose outputs stray most from float take
/// the cheapest remedy that brings them in line, until the target holds or the budget is spent.
///
/// Note [Accuracy target]
///   1. Metric, over every floating-point graph output, one held-out sample at a time:
///        cosine     the worst sample's cosine similarity to the float output
///        sqnr       10 log10(sum f^2 / sum (q - f)^2) over all samples, in dB
///        mse        mean of (q - f)^2 over all elements
///        maxabs     the largest |q - f| of any element: the tolerance of outputs read as
///                   values (a probability compared with a threshold, a regressed box)
///        argmax-agreement  the share of positions (every index but the last axis) where the
///                   largest entry along an output's last axis is the same as float's: the
///                   tolerance of outputs read as classes (a classifier, a CTC recognizer's
///                   time steps, a segmentation's pixels with classes last); outputs whose
///                   last axis has fewer than 2 entries are left out
///        ctc-agreement  the share of sequences whose greedy CTC decoding (the largest class
///                   at each step, repeats merged, the blank `ctc_blank` dropped) is float's:
///                   the tolerance of a recognizer read as text, which per-step argmax
///                   overstates (a step moving between a character and the blank beside it
///                   leaves the text as it was). Classes on the last axis, time on the last
///                   axis before it longer than 1 ([1, T, C] and [T, 1, C] alike)
///        top1-drop  FP32 minus simulated top-1 accuracy on --eval-data/--eval-labels, in points
///   2. Remedies, cheapest first (`fallback`): "range" (another range for the layer's
///      activations: the candidates of the `auto` observer's histogram, streamed once over the
///      calibration data, each input taking the one under which the layer's output is closest
///      to float), "per-channel" (per-tensor weights observed per output channel, where the
///      backend allows), "int16" (16-bit activations, where the backend allows), "float" (the
///      layer unquantized). Only int16 and float count against the budget.
///   3. Layer errors, from cached inputs: one float pass per held-out sample; at each layer its
///      float inputs are at hand and it runs once per remedy it can take; the error of its own
///      outputs against float is relative per slice (Note [Relative layer error]), averaged
///      over the slices so that layers of any width compare. No model run per layer.
///   4. Search: the j layers with the largest error are remedied, each with the cheapest remedy
///      whose error is no larger than that of the first layer left as calibrated (float, with
///      none, always qualifies; if the ladder has no remedy that does, the one that errs least).
///      j starts as large as the budget allows; if the target then holds, bisection over j
///      finds the fewest remedied layers that still hold it (about log2 of the layer count
///      evaluations, trusting that remedying more never hurts). If it does not hold, the
///      configuration with the best metric is kept and the report says the target was missed.
/// Deterministic: data in file order, ties broken by graph order. 16-bit activations export as
/// int16/uint16 Q/DQ at opset 21; float layers export with no Q/DQ.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/registrar.h"

namespace sparsebit {

/// One layer's sensitivity: the error of its own outputs, quantized, against float.
struct LayerSensitivity {
  std::string node, op_type;
  double sqnr_db = 0;           ///< the layer's own output against float, as calibrated; the ranking's worst first
  std::string remedy;           ///< fallback layers: "range", "per-channel", "int16" or "float"
  double remedied_sqnr_db = 0;  ///< fallback layers: sqnr_db under the remedy
};

struct TargetReport {
  std::string target;       ///< "cosine>=0.99"
  std::string measured_on;  ///< what the metric was measured on
  std::int64_t samples = 0;
  double before = 0, after = 0;  ///< the metric with every layer quantized, and as exported
  bool reached = false;
  std::string precision;                          ///< the costliest remedy used ("" when none was needed)
  std::vector<LayerSensitivity> fallback_layers;  ///< the layers remedied, most erring first
  std::map<std::string, std::size_t> remedies;    ///< remedy -> how many layers took it
  std::size_t quantized_layers = 0, budget = 0;
  int evaluations = 0;                          ///< whole-model measurements of a configuration
  double sensitivity_seconds = 0, seconds = 0;  ///< preparing the remedies and measuring the layers; all
  std::vector<LayerSensitivity> ranking;        ///< every quantized layer, most erring first
};

struct TargetData {
  /// Held-out samples, one per entry (batch dimension 1), one tensor per graph input.
  std::vector<std::vector<at::Tensor>> holdout;
  std::string holdout_description;
  /// Calibration data again, for the observers of 16-bit activations (the same samples the
  /// model was calibrated on).
  DataSource calibration;
  /// An observer that offers candidate ranges (the `auto` observer), for the range remedy;
  /// empty: no range remedy.
  ObserverFactory range_observer;
  /// top1-drop: evaluation batches and one label per sample.
  std::vector<std::vector<at::Tensor>> eval;
  at::Tensor eval_labels;
  std::string eval_description;
};

/// Meets `target` on a calibrated model (Note [Accuracy target]); the model is left in the
/// chosen configuration with quantization off. `progress` counts the held-out samples
/// of the layer measurement.
SPARSEBIT_API TargetReport meet_target(QuantModel& qm, const TargetConfig& target, const TargetData& data,
                                       const ProgressFn& progress = {});

/// The report as JSON text (the "target" of `sparsebit quantize --report`).
SPARSEBIT_API std::string target_report_json(const TargetReport& r);

}  // namespace sparsebit
