#pragma once
/// \file
/// The error profiler: how far a calibrated model's quantized outputs are from the float ones,
/// layer by layer (`sparsebit profile`).
///
/// Two views, each over the same profiling batches:
///   - accumulated: every quantizer on; the error of each quantized layer's output, which includes
///     what earlier layers contributed (where error builds up);
///   - single: one layer's quantizers on at a time; the error of the model's first output (each
///     layer's own sensitivity). Costs one pass over the batches per layer.
/// Error measures: MSE, cosine similarity and SQNR (10 log10 of signal power over error power).

#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {

struct LayerError {
  std::string node, op_type, tensor;  ///< the layer and the tensor measured
  double mse = 0, cosine = 1, sqnr_db = 0;
};

struct ProfileOptions {
  std::int64_t samples = 64;  ///< profiling samples (read from the data once, kept in memory)
  bool accumulated = true;    ///< run the all-quantizers-on view
  bool single = true;         ///< run the one-layer-at-a-time view
  ProgressFn progress = {};   ///< single view: (layers done, layers)
};

struct ProfileReport {
  std::string model, output;  ///< model path and the output the single view measures
  std::int64_t samples = 0;
  std::vector<LayerError> accumulated;  ///< graph order
  std::vector<LayerError> single;       ///< graph order
  LayerError whole;                     ///< every quantizer on, at the model output
};

/// Profiles a calibrated QuantModel; quantizer switches are restored afterwards.
SPARSEBIT_API ProfileReport profile(QuantModel& qm, Dataset& data, const ProfileOptions& options = {});
SPARSEBIT_API std::string profile_json(const ProfileReport& r);
/// A self-contained HTML page (inline SVG, no scripts, no network): both views as bar charts
/// sorted worst first, and the tables.
SPARSEBIT_API std::string profile_html(const ProfileReport& r);

}  // namespace sparsebit
