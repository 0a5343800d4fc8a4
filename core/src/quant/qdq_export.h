#pragma once
// The QDQ exporter: a QuantModel's float graph with QuantizeLinear/DequantizeLinear on the edges
// its slots quantize (qdq_export.cpp).

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/quant_slots.h"

namespace sparsebit {

struct QdqExportInput {
  const Graph& graph;  ///< the float graph the slots address
  const ModelMeta& meta;
  const Executor& executor;  ///< current constant values (trained weights after QAT)
  const QuantSlots& slots;
  const Backend& backend;
  std::string backend_name, backend_plugin;                ///< for messages
  std::vector<std::string> trained;                        ///< constants QAT trained: the executor's values are written
  std::vector<std::pair<std::string, at::Tensor>> states;  ///< "state NAME" running statistics
  const OpTraitTable& ops;                                 ///< the ops' traits: lifting to the opset the export needs
};

/// The QDQ graph, lifted to the opset the backend and the slots' widths need.
Graph export_qdq(const QdqExportInput& in);
/// metadata_props of the exported model (sparsebit.bits for widths below 8).
std::map<std::string, std::string> qdq_metadata(const QuantSlots& slots);

}  // namespace sparsebit
