#pragma once
// The pruning report as a JSON value, for prune_report_json and for the pipeline's report files,
// which compose it with the others.

#include <nlohmann/json.hpp>

#include "sparsebit/core/prune.h"

namespace sparsebit {

nlohmann::json prune_report_value(const PruneSummary& r);

}  // namespace sparsebit
