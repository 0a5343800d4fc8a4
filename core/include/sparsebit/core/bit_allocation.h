#pragma once
/// \file
/// Mixed precision chosen by measured sensitivity under average bit budgets (`[bit_allocation]`,
/// the original toolkit's SCHEDULE.BIT_ALLOCATION).
///
/// Note [Bit allocation]
/// The inputs allocated are the quantized weights (budget avg_weight_bits, averaged over their
/// parameters) and the activation inputs of layers with a quantized weight (avg_activation_bits,
/// averaged over those layers' multiply-accumulates, so a width costs what it saves in compute).
/// Every one of them is calibrated at each width of `choices` on the first `samples`
/// calibration samples, and its quantizer for each width kept. Errors are measured where the
/// allocation will land, not around the float model: at an operating point (first every
/// allocated input at the narrowest choice that meets its budget, the rest quantized as
/// configured), the model's relative output error sum((q - f)^2) / sum(f^2) is taken, then each
/// input in turn takes each other width, and what that adds to the error is its sensitivity
/// there. Errors of separate inputs are taken to add up, which makes the choice a multiple-choice
/// knapsack per budget: every input starts at the widest choice, the input whose next narrower
/// width adds the least error per bit saved (error / (cost x bits)) is narrowed until the budget
/// holds, then inputs are widened again, most error saved per bit first, while the budget still
/// holds. A second round measures around that choice and chooses again; the choice whose own
/// measured model error is lower is kept. Far from where they were measured the errors need not
/// add up: on PP-OCRv4's recognizer, errors measured around the float model, one input at a time,
/// chose 4-bit layers that each looked harmless and together left 2% of the lines right.
/// The chosen widths are set (the caller calibrates again, on all the calibration data),
/// reported and exported like any others.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/sdk/op.h"  // InputRole

namespace sparsebit {

/// One allocated input: its sensitivities and the width chosen.
struct AllocatedInput {
  std::size_t slot = 0;  ///< index into QuantModel::slots()
  std::string node, tensor;
  InputRole role = InputRole::kWeight;
  std::int64_t cost = 0;  ///< parameters (weights) or MACs per sample (activations)
  /// Per width: the relative output error it adds to the operating point's (0 at its own), as
  /// measured in the round whose choice was kept.
  std::map<int, double> error;
  int bits = 8;  ///< the width chosen
};

struct BitAllocation {
  std::optional<double> weight_target, activation_target;  ///< the budgets asked for
  double weight_average = 0, activation_average = 0;       ///< the averages reached
  std::vector<int> choices;
  std::int64_t samples = 0;
  double model_error = 0;  ///< relative output error on the samples with the widths chosen
  double seconds = 0;
  std::vector<AllocatedInput> inputs;  ///< in slot order
};

}  // namespace sparsebit
