#pragma once
// The quantization report as a JSON value, for the JSON the model writes and for the pipeline's
// report files, which compose it with the others.

#include <nlohmann/json.hpp>

#include "sparsebit/core/quant_model.h"

namespace sparsebit {

nlohmann::json quantization_report_value(const QuantizationReport& r);

}  // namespace sparsebit
