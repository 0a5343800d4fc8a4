#pragma once
// Where the `onnxruntime` backend puts Q/DQ so that ONNX Runtime runs the quantized layers as its
// integer kernels (Note [ONNX Runtime placement] in onnxruntime_placement.cpp).

#include "sparsebit/sdk/pass.h"

namespace sparsebit::backends {

/// Time an integer kernel of ONNX Runtime saves on one multiply-add, in units of one
/// QuantizeLinear or DequantizeLinear pass over one element (Note [ONNX Runtime placement]).
inline constexpr double kOnnxRuntimeSavedPerMac = 1.0 / 28;

/// Adds and bypasses quantizers of the main graph of `state` for ONNX Runtime's QDQ fusions.
void place_for_onnxruntime(QuantState& state, double saved_per_mac = kOnnxRuntimeSavedPerMac);

}  // namespace sparsebit::backends
