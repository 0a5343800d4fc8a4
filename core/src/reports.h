#pragma once
// The typed reports as JSON values, for the pipeline to compose into the files it writes.

#include <nlohmann/json.hpp>

#include "sparsebit/core/prune.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {

nlohmann::json prune_report_value(const PruneSummary& r);
nlohmann::json quantization_report_value(const QuantizationReport& r);

}  // namespace sparsebit
