#pragma once
// Conversions between ONNX protobuf messages and the IR (onnx_proto.cpp), shared by the import
// and the export in onnx_io.cpp.

#include <ATen/core/Tensor.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "sparsebit/core/onnx_io.h"

namespace sparsebit::proto {

constexpr std::int32_t kUint4 = 21, kInt4 = 22;               // TensorProto.DataType numbers (opset 21)
constexpr std::int32_t kFloat8E4M3FN = 17, kFloat8E5M2 = 19;  // (opset 19)

/// ONNX element types at::Tensor cannot hold: held widened (int4, uint4, uint16) or as their
/// uint8 codes (float8), and named in Graph::narrow_types.
bool is_narrow_type(std::int32_t t);
bool is_float8_type(std::int32_t t);

/// A TensorProto's value (raw, typed fields, packed 4-bit or external data under `base_dir`);
/// `what` names it in errors. Float8 values come as their uint8 codes.
at::Tensor tensor_from_proto(const onnx::TensorProto& p, const std::filesystem::path& base_dir,
                             const std::string& what);
/// tensor_from_proto for a proto about to be dropped: plain raw data moves into the tensor
/// without a copy (the proto's raw_data is emptied).
at::Tensor take_tensor_from_proto(onnx::TensorProto& p, const std::filesystem::path& base_dir, const std::string& what);
/// `narrow_type`: a 4-bit or 16-bit ONNX type the tensor's wider storage stands for (0: none).
void tensor_to_proto(const at::Tensor& t, const std::string& name, onnx::TensorProto* p, std::int32_t narrow_type = 0);
Attribute attribute_from_proto(const onnx::AttributeProto& a, const std::filesystem::path& base,
                               const std::string& where);
void attribute_to_proto(const std::string& key, const Attribute& a, onnx::AttributeProto* p);
/// ATen type of an ONNX element type; `what` names the value in the error for the others.
at::ScalarType scalar_type_of(std::int32_t t, const std::string& what);
ValueInfo value_info_from_proto(const onnx::ValueInfoProto& v);
void value_info_to_proto(const ValueInfo& v, onnx::ValueInfoProto* p);
/// The structure of `graph` for ONNX's shape inference (onnx_export.cpp): its nodes and bodies,
/// inputs and outputs, and the initializers of up to `inline_elements` elements (shapes, axes);
/// larger ones become typed and shaped graph inputs without their data.
onnx::ModelProto structure_of(const Graph& graph, std::int64_t inline_elements);

}  // namespace sparsebit::proto
