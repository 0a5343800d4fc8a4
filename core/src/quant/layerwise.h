#pragma once
// The layerwise and asym calibration runner (Note [Layerwise runner] in quant_model.h).

#include "sparsebit/core/quant_model.h"

namespace sparsebit {

CalibrationStats run_layerwise(QuantModel& qm, Dataset& data, const ProgressFn& progress);

}  // namespace sparsebit
