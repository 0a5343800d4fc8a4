#pragma once
/// \file
/// BN tuning: re-estimating BatchNormalization statistics with quantization on, so that the
/// statistics folded into the convolutions are those of the quantized network's activations.
/// `bn_tuning = true` in `[schedule]` runs it inside `sparsebit quantize`.
///
/// The model is converted with fuse_bn off (BatchNormalization nodes stay), calibrated, and run
/// once more over the calibration data with every quantizer on; each BatchNormalization
/// normalizes with the statistics of the batch in flight (as in training mode, so the layers
/// after it see tuned activations at once) while the statistics over all samples accumulate.
/// Those replace the running mean and variance; the returned float model is then converted
/// again as usual, and fuse_bn folds the tuned statistics.

#include <string>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/registry.h"

namespace sparsebit {

/// Whether `config` schedules BN tuning.
SPARSEBIT_API bool bn_tuning_enabled(const Config& config);

/// Returns `model` with re-estimated BatchNormalization statistics (see above). `calib` is
/// opened twice (calibration, then the tuning pass). Logs and returns the model unchanged when
/// it has no BatchNormalization with constant parameters.
SPARSEBIT_API Model tune_batchnorm(const Model& model, const Config& config, const Registry& registry,
                                   const DataSource& calib);

}  // namespace sparsebit
