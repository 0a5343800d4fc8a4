#pragma once
// Note [Half-precision models]
// LibTorch's CPU kernels do not run float16 convolutions or min/max reductions, and ONNX's
// QuantizeLinear takes float16 scales only from opset 19. So a model whose values are float16 or
// bfloat16 is computed in float32: at import its weights, declarations, Cast targets, dtype
// attributes and constants in attributes (bodies included) become float32, and the export wraps
// the graph in Casts so that each input and output keeps the type the model declared (float32
// inside, where the Q/DQ pairs are; TensorRT and ONNX Runtime run those parts in their own
// precision). Calibration data of float16 feeds it exactly (float16 widens to float32 without loss).

#include <onnx/onnx_pb.h>

#include <string>

#include "sparsebit/core/onnx_io.h"

namespace sparsebit {

/// Converts `model` (just read; `proto_graph` holds the value_info kept in the model's skeleton)
/// to float32 where it is float16 or bfloat16, recording the interface types in its meta.
void compute_half_precision_in_float(Model& model, onnx::GraphProto& proto_graph, const std::string& name);

/// For export: `graph` (a copy) with Casts at the inputs and outputs whose declared type was
/// half precision, so the file takes and gives what the source model did.
void restore_half_precision_interface(Graph& graph, const ModelMeta& meta);

}  // namespace sparsebit
