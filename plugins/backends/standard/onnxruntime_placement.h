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

/// Pads the input channels (1 to 3) of the exported QDQ convolutions that ONNX Runtime would otherwise
/// run on its slow integer path (Note [ONNX Runtime channel padding] in onnxruntime_export.cpp).
void pad_convolutions_for_onnxruntime(Graph& graph);

}  // namespace sparsebit::backends
