#pragma once
/// \file
/// Mixed precision chosen by measured sensitivity under average bit budgets (`[bit_allocation]`,
/// the original toolkit's SCHEDULE.BIT_ALLOCATION).
///
/// Note [Bit allocation]
/// The inputs allocated are the quantized weights (budget avg_weight_bits, averaged over their
/// parameters) and the activation inputs of layers with a quantized weight (avg_activation_bits,
/// averaged over those layers' multiply-accumulates, so a width costs what it saves in compute).
/// For every width of `choices`, all of them are calibrated at that width on the first `samples`
/// calibration samples; then each is switched on alone and the model's float outputs are
/// compared with its outputs: the relative error sum((q - f)^2) / sum(f^2) is that input's
/// sensitivity at that width. Errors of separate inputs are taken to add up, which makes the
/// choice a multiple-choice knapsack per budget: every input starts at the widest choice, the
/// input whose next narrower width adds the least error per bit saved (error / (cost x bits))
/// is narrowed until the budget holds, then inputs are widened again, most error saved per bit
/// first, while the budget still holds. The chosen widths are set (the slots are calibrated
/// again by the caller, on all the calibration data), reported and exported like any others.

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
  std::int64_t cost = 0;        ///< parameters (weights) or MACs per sample (activations)
  std::map<int, double> error;  ///< relative output error with only this input quantized, per width
  int bits = 8;                 ///< the width chosen
};

struct BitAllocation {
  std::optional<double> weight_target, activation_target;  ///< the budgets asked for
  double weight_average = 0, activation_average = 0;       ///< the averages reached
  std::vector<int> choices;
  std::int64_t samples = 0;
  double seconds = 0;
  std::vector<AllocatedInput> inputs;  ///< in slot order
};

}  // namespace sparsebit
