#pragma once
// The tensor plugin's parts, registered together by tensor_ops.cpp.

#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {

/// Gathers, scatters and the ops that select or find elements (tensor_index_ops.cpp).
void register_index_ops(Registrar& r);
/// Shape, Size, the casts, constants, ranges and masks (tensor_value_ops.cpp).
void register_value_ops(Registrar& r);
/// Channel flow and opset lifts of every op of the plugin (tensor_traits.cpp).
void register_traits(Registrar& r);

}  // namespace sparsebit::ops
