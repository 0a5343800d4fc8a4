#pragma once
/// \file
/// ONNX import and export. Import lifts models below opset 13 with Sparsebit's own rules
/// (sparsebit/core/opset_lift.h; per-channel QuantizeLinear needs 13; models older than opset 7
/// go through ONNX's version converter to 7 first), folds Constant nodes into initializers,
/// names unnamed nodes, reads external data, and validates the graph. Export re-emits the IR with the
/// original model's metadata, runs ONNX's checker where the installed ONNX knows the opset, and
/// writes atomically.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/sdk/graph.h"

namespace sparsebit {

class Registry;

/// Model-level data kept from the source file so export is a faithful re-emit.
struct ModelMeta {
  std::string source_path;
  std::int64_t source_opset = 0;                      ///< default-domain opset before any conversion
  std::string skeleton;                               ///< serialized ModelProto without nodes and initializers
  std::map<std::string, std::string> metadata_props;  ///< the model's metadata_props, as imported
  std::vector<ValueInfo> value_info;  ///< declared types and shapes of intermediate values (for lifting)
  /// Serialized TypeProto of the sequence- and optional-typed inputs and outputs of the graph and
  /// its bodies, by name (ValueInfo describes tensors only); written back on export.
  std::map<std::string, std::string> value_types;
  /// Inputs and outputs the model declared float16 or bfloat16 (ONNX element type, by name):
  /// computed in float32, written back in their own type (Note [Half-precision models]).
  std::map<std::string, std::int32_t> interface_types;
};

struct Model {
  Graph graph;
  ModelMeta meta;
};

struct ImportOptions {
  /// Models of a lower default-domain opset are lifted to this one with static facts only, by
  /// the lifting rules of `registry`'s ops, which it then needs (0: keep the model's opset;
  /// load_and_lift() lifts with lift_model(), which also runs a sample, and QuantModel lifts to
  /// 13 itself).
  std::int64_t min_opset = 0;
  /// The ops' plugins, which also check their nodes at import (ChecksAtImport: a Conv's
  /// attributes against its weight); without it, only ONNX's schemas check the nodes.
  const Registry* registry = nullptr;
  /// Computes float16 and bfloat16 values in float32, exported back to the model's input and
  /// output types (Note [Half-precision models]): what quantizing needs. Off, a model is read
  /// as it is (to run an export as a runtime would).
  bool half_in_float = false;
};

SPARSEBIT_API Model load_onnx(const std::string& path, const ImportOptions& options = {});
SPARSEBIT_API Model load_onnx_from_bytes(const std::string& bytes, const std::string& name,
                                         const ImportOptions& options = {});

struct ExportOptions {
  bool run_checker = true;
  /// Added to (or replacing keys of) the model's metadata_props.
  std::map<std::string, std::string> metadata_props;
  /// ONNX external data: initializers of at least `external_min_bytes` go to a side file when
  /// `external_data` is set or when all initializers together exceed
  /// `external_threshold_bytes` (default 1 GiB, well below protobuf's 2 GiB message limit).
  bool external_data = false;
  std::int64_t external_threshold_bytes = std::int64_t{1} << 30;
  std::int64_t external_min_bytes = 1024;
};

/// Serializes `graph` with `meta`'s model-level fields, checks it, and writes `path`
/// atomically (a temporary file in the same folder, renamed over the target). External data,
/// when used, goes to `path` + ".data" beside it, written (atomically) before the model.
SPARSEBIT_API void save_onnx(const Graph& graph, const ModelMeta& meta, const std::string& path,
                             const ExportOptions& options = {});
/// Serializes the model. With `external` given, initializers chosen by the options' external
/// data rules are written to *external instead, referenced by `external_location` (a file name
/// relative to the model); otherwise a model over the protobuf limit is an Error.
SPARSEBIT_API std::string serialize_onnx(const Graph& graph, const ModelMeta& meta, const ExportOptions& options = {},
                                         std::string* external = nullptr, const std::string& external_location = "");
/// Note [External data side file]
/// A model whose large tensors are external names its side file relative to itself (ONNX keeps
/// external data beside the model): `location`, by default the model's file name + ".data".
/// Every writer of models (the pipeline's jobs, save_onnx, Python's export) writes the side
/// file first and the model last, each atomically, so a model never names a side file that is
/// not there, and a failed run leaves neither.
/// The side file's default location for a model written to `model_path`.
SPARSEBIT_API std::string default_side_file(const std::string& model_path);
/// Writes `bytes` (when not empty) as the side file `location` beside `model_path`, atomically;
/// returns whether it wrote.
SPARSEBIT_API bool write_side_file(const std::string& model_path, const std::string& bytes,
                                   const std::string& location = "");
/// Writes serialize_onnx's two outputs: the side file (if any) first, then the model; both atomic.
SPARSEBIT_API void write_onnx_files(const std::string& path, const std::string& model_bytes,
                                    const std::string& external_bytes, const std::string& location = "");

/// Highest default-domain opset the linked ONNX library's checker knows.
SPARSEBIT_API std::int64_t onnx_library_max_opset();

/// Reads a serialized onnx.TensorProto file (the ONNX test-data layout). Sets *name if given.
SPARSEBIT_API at::Tensor load_tensor_pb(const std::string& path, std::string* name = nullptr);
/// A value of the ONNX test-data layout: a TensorProto, or, where `type` (a serialized TypeProto,
/// as in ModelMeta::value_types) says so, a SequenceProto (a sequence value, Note [Sequence
/// values]) or an OptionalProto (its element; undefined when it holds none).
SPARSEBIT_API at::Tensor load_value_pb(const std::string& path, const std::string& type);

/// ONNX element type name ("float", "int64", ...) for messages.
SPARSEBIT_API std::string onnx_type_name(std::int32_t elem_type);
/// A declared shape as messages show it: "[N, 3, 224, 224]" (a symbolic dimension by its name,
/// an unknown one as "?").
SPARSEBIT_API std::string shape_text(const std::vector<Dim>& shape);
SPARSEBIT_API std::int32_t onnx_type_of(at::ScalarType t);

}  // namespace sparsebit
