#pragma once
// The nn plugin's parts, registered together by nn_ops.cpp.

#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {

/// Instance, Layer and Group normalization, LRN, MeanVarianceNormalization (nn_norm_ops.cpp).
void register_norm_ops(Registrar& r);
/// Weighted layers, channel flow, statistics and opset lifts of every op of the plugin (nn_traits.cpp).
void register_traits(Registrar& r);

}  // namespace sparsebit::ops
