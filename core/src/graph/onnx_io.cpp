#include "sparsebit/core/onnx_io.h"
#include "base/log.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/op_traits.h"

#include <ATen/ATen.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <sys/wait.h>
#include <csignal>
#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "base/core_ops.h"
#include "base/limits.h"
#include "base/mapped_file.h"
#include "graph/half_precision.h"
#include "graph/onnx_proto.h"
#include "graph/run_isolated.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace fs = std::filesystem;

using proto::attribute_from_proto;
using proto::attribute_to_proto;
using proto::take_tensor_from_proto;
using proto::tensor_from_proto;
using proto::tensor_to_proto;
using proto::value_info_from_proto;
using proto::value_info_to_proto;

namespace {

constexpr std::int64_t kMaxOpset = 21;      // the newest default-domain opset the executor implements
constexpr std::int64_t kMaxIrVersion = 11;  // ONNX 1.18's IR

std::int64_t default_opset_of(const onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return 0;
}

// Constant node -> tensor (its value attribute in any of the spec's forms).
at::Tensor constant_value(const Node& n) {
  if (n.has_attr("value")) return n.attr_tensor("value");
  if (n.has_attr("value_float")) return at::scalar_tensor(n.attr_float("value_float", 0), at::kFloat);
  if (n.has_attr("value_int")) return at::scalar_tensor(n.attr_int("value_int", 0), at::kLong);
  if (n.has_attr("value_floats")) {
    auto v = n.attr_floats("value_floats");
    return at::tensor(std::vector<float>(v.begin(), v.end()), at::kFloat);
  }
  if (n.has_attr("value_ints")) return at::tensor(n.attr_ints("value_ints"), at::kLong);
  throw Error(n.describe() + ": Constant with a sparse or string value is not supported");
}

/// Checks a node against its ONNX schema (input/output counts, attribute names, kinds and
/// required attributes) and the element types of its inputs whose type the file states
/// (initializers, graph inputs) against the schema's type constraints. Nodes of other domains
/// and opsets newer than the installed ONNX knows are left to their plugins.
void verify_node(const onnx::NodeProto& np, const Node& n, std::int64_t opset,
                 const std::map<std::string, std::int32_t>& known_types, const std::string& name) {
  if (!(np.domain().empty() || np.domain() == "ai.onnx") || opset > onnx_library_max_opset()) return;
  const auto* schema = onnx::OpSchemaRegistry::Schema(np.op_type(), static_cast<int>(opset), "");
  if (!schema) return;
  const std::string spec = np.op_type() + "-" + std::to_string(schema->SinceVersion());
  try {
    schema->Verify(np);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto cut = why.find("==>"); cut != std::string::npos) why = why.substr(0, cut);
    while (!why.empty() && (why.back() == ' ' || why.back() == '\n' || why.back() == '.')) why.pop_back();
    throw Error(name + ": " + n.describe() + " does not follow the ONNX spec of " + spec + ": " + why +
                ". Fix or re-export the model");
  }
  const auto& formals = schema->inputs();
  for (int i = 0; i < np.input_size() && !formals.empty(); ++i) {
    auto t = known_types.find(np.input(i));
    if (np.input(i).empty() || t == known_types.end()) continue;
    const auto& formal = formals[std::min<std::size_t>(static_cast<std::size_t>(i), formals.size() - 1)];
    const std::string type = "tensor(" + onnx_type_name(t->second) + ")";
    bool allowed = false;
    for (const auto* allowed_type : formal.GetTypes()) allowed = allowed || *allowed_type == type;
    if (!allowed) {
      throw Error(name + ": " + n.describe() + ": input " + std::to_string(i) + " ('" + np.input(i) + "', " +
                  formal.GetName() + ") is " + onnx_type_name(t->second) + ", which " + spec + " does not accept");
    }
  }
}

/// Lifts `proto` to `opset` with ONNX's shape inference and version converter, isolated.
onnx::ModelProto convert_isolated(const onnx::ModelProto& proto, std::int64_t opset, const std::string& name,
                                  std::int64_t source_opset) {
  const std::string hint = ". Re-export the model at opset " + std::to_string(opset) + " or newer";
  int status = 0;
  const std::string result = run_isolated(
      proto,
      [opset](onnx::ModelProto& m) {
        try {
          onnx::shape_inference::InferShapes(m);  // some adapters (Softmax 12->13) need input shapes
        } catch (const std::exception&) {
        }
        return onnx::version_conversion::ConvertVersion(m, static_cast<int>(opset));
      },
      status);
  if (result.empty()) {
    throw Error(name + ": ONNX's version converter crashed on this model (" +
                (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) : std::string("no result")) +
                ") while lifting it from opset " + std::to_string(source_opset) + " to " + std::to_string(opset) +
                "; the model is malformed" + hint);
  }
  if (result[0] == '0') {
    throw Error(name + ": ONNX's version converter could not lift the model from opset " +
                std::to_string(source_opset) + " to " + std::to_string(opset) + ": " + result.substr(1) + hint);
  }
  onnx::ModelProto converted;
  if (!converted.ParseFromArray(result.data() + 1, static_cast<int>(result.size() - 1)))
    throw Error(name + ": the converted model could not be read back");
  return converted;
}

/// Reads a GraphProto's initializers, inputs, outputs and nodes into `g` (whose opset_imports
/// are set); graph-valued attributes become subgraphs read the same way (Note [Subgraphs]).
/// Node names are made unique across all nesting levels through `used_names`.
void read_graph(const onnx::GraphProto& gp, Graph& g, const fs::path& base, const std::string& name,
                std::set<std::string>& used_names, bool main, std::map<std::string, std::string>& types) {
  auto keep_type = [&](const onnx::ValueInfoProto& v) {
    if (v.type().has_sequence_type() || v.type().has_optional_type()) types[v.name()] = v.type().SerializeAsString();
  };
  for (const auto& v : gp.input()) keep_type(v);
  for (const auto& v : gp.output()) keep_type(v);
  for (const auto& init : gp.initializer()) {
    const std::string what = name + ": initializer '" + init.name() + "'";
    // The main graph is model_from_proto's own (mutable) proto, dropped after reading: its
    // tensors' bytes move into the IR rather than being copied.
    g.initializers[init.name()] = main ? take_tensor_from_proto(const_cast<onnx::TensorProto&>(init), base, what)
                                       : tensor_from_proto(init, base, what);
    if (proto::is_narrow_type(init.data_type())) g.narrow_types[init.name()] = init.data_type();
  }
  if (gp.sparse_initializer_size() > 0) throw Error(name + ": sparse initializers are not supported");
  for (const auto& in : gp.input()) {
    if (!g.initializers.count(in.name())) g.inputs.push_back(value_info_from_proto(in));
  }
  for (const auto& out : gp.output()) {
    const auto& type = out.type();  // sequence and optional types are reported where they are used
    if (main && (type.value_case() == onnx::TypeProto::VALUE_NOT_SET ||
                 (type.has_tensor_type() && type.tensor_type().elem_type() == 0))) {
      throw Error(
          name + ": graph output '" + printable(out.name()) +
          "' declares no tensor element type; the model is malformed (re-export it, or fix its outputs' types)");
    }
    g.outputs.push_back(value_info_from_proto(out));
  }

  std::map<std::string, std::int32_t> known_types;  // element types the file states
  for (const auto& init : gp.initializer()) known_types[init.name()] = init.data_type();
  for (const auto& in : gp.input())
    if (in.type().has_tensor_type() && !known_types.count(in.name()))
      known_types[in.name()] = in.type().tensor_type().elem_type();
  const std::int64_t opset = g.default_opset();

  std::size_t index = 0;
  for (const auto& np : gp.node()) {
    Node n;
    n.op_type = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    n.name = np.name().empty() ? n.op_type + "_" + std::to_string(index) : np.name();
    ++index;
    if (!used_names.insert(n.name).second) {  // names must be unique for globs and messages
      std::string base_name = n.name;
      for (int k = 1; !used_names.insert(n.name).second; ++k) n.name = base_name + "_" + std::to_string(k);
    }
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    n.doc_string = np.doc_string();
    verify_node(np, n, opset, known_types, name);
    std::int32_t value_type = 0;  // a Constant's element type
    for (const auto& a : np.attribute()) {
      if (a.name() == "value" && a.has_t()) value_type = a.t().data_type();
      if (a.type() == onnx::AttributeProto::GRAPH) {
        Graph sub;
        sub.opset_imports = g.opset_imports;
        read_graph(a.g(), sub, base, name, used_names, /*main=*/false, types);
        try {
          sub.topological_sort();
        } catch (const Error& e) {
          throw Error(name + ": in '" + a.name() + "' of " + n.describe() + ": " + e.what());
        }
        n.attributes[a.name()] = Attribute::of_graph(std::move(sub));
        continue;
      }
      n.attributes[a.name()] = attribute_from_proto(a, base, name + ": " + n.describe());
    }
    if (core_ops::is(n, core_ops::kConstant) && n.outputs.size() == 1) {
      g.initializers[n.outputs[0]] = constant_value(n);
      if (proto::is_narrow_type(value_type)) g.narrow_types[n.outputs[0]] = value_type;
      continue;
    }
    g.append(std::move(n));
  }
}

/// Float8 values are held as their uint8 codes (Graph::narrow_types), which only QuantizeLinear
/// (as its zero point; its output is float8 by that or by output_dtype) and DequantizeLinear decode: any other reader
/// would compute on the codes, so it is refused. `g` is topologically sorted.
void check_float8_readers(const Graph& g) {
  std::set<std::string> float8;
  for (const auto& [value, type] : g.narrow_types)
    if (proto::is_float8_type(type)) float8.insert(value);
  for (const Node* n : g.nodes()) {
    for (const Graph* sub : n->subgraphs()) check_float8_readers(*sub);
    const bool quantize = core_ops::is(*n, core_ops::kQuantizeLinear);
    for (std::size_t i = 0; i < n->inputs.size(); ++i) {
      if (!float8.count(n->inputs[i])) continue;
      const bool decodes = quantize ? i == 2 : core_ops::is(*n, core_ops::kDequantizeLinear) && i != 1;
      if (!decodes)
        throw Error(n->describe() + " reads '" + n->inputs[i] + "' (input " + std::to_string(i) +
                    "), which holds float8 values; the executor reads float8 only as DequantizeLinear's input or "
                    "zero point and QuantizeLinear's zero point (dequantize it to float first)");
    }
    const std::int64_t output_dtype = quantize && !n->has_input(2) ? n->attr_int("output_dtype", 0) : 0;
    if (quantize &&
        ((n->has_input(2) && float8.count(n->inputs[2])) || proto::is_float8_type(std::int32_t(output_dtype))))
      float8.insert(n->outputs.at(0));
  }
  for (const auto& out : g.outputs)
    if (float8.count(out.name))
      throw Error("graph output '" + out.name +
                  "' holds float8 values, which the executor does not return; end the graph with a DequantizeLinear");
}

/// Note [Declarations checked at import]
/// The main graph's declared inputs, outputs and value_info are checked before anything is built
/// from them: a dimension below -1 (-1 is older exporters' word for an open dimension, read so)
/// and two declarations of one value that disagree on its element type or on a fixed dimension
/// are refused with the value named, rather than written into the export for a runtime to trip
/// over.
void check_declarations(const onnx::GraphProto& gp, const std::string& name) {
  std::map<std::string, std::pair<const onnx::ValueInfoProto*, const char*>> seen;
  auto check = [&](const onnx::ValueInfoProto& v, const char* what) {
    if (!v.type().has_tensor_type()) return;
    const auto& tt = v.type().tensor_type();
    for (int d = 0; d < tt.shape().dim_size(); ++d)
      if (tt.shape().dim(d).has_dim_value() && tt.shape().dim(d).dim_value() < -1)
        throw Error(name + ": " + what + " '" + printable(v.name()) + "' declares dimension " + std::to_string(d) +
                    " as " + std::to_string(tt.shape().dim(d).dim_value()) +
                    "; a dimension is a size (0 or more) or a name (-1 is read as open)");
    const auto emplaced = seen.try_emplace(v.name(), &v, what);
    const auto it = emplaced.first;  // not a structured binding: the lambda below uses it
    if (emplaced.second || !it->second.first->type().has_tensor_type()) return;
    const auto& before = it->second.first->type().tensor_type();
    const auto contradiction = [&](const std::string& why) {
      throw Error(name + ": " + what + " '" + printable(v.name()) + "' contradicts its declaration as " +
                  it->second.second + ": " + why +
                  " (fix or drop one of them; onnx.shape_inference rewrites value_info)");
    };
    if (before.elem_type() != 0 && tt.elem_type() != 0 && before.elem_type() != tt.elem_type())
      contradiction("element type " + std::to_string(tt.elem_type()) + " against " +
                    std::to_string(before.elem_type()));
    if (before.has_shape() && tt.has_shape()) {
      if (before.shape().dim_size() != tt.shape().dim_size())
        contradiction("rank " + std::to_string(tt.shape().dim_size()) + " against " +
                      std::to_string(before.shape().dim_size()));
      for (int d = 0; d < tt.shape().dim_size(); ++d) {
        const auto &a = tt.shape().dim(d), &b = before.shape().dim(d);
        if (a.has_dim_value() && b.has_dim_value() && a.dim_value() >= 0 && b.dim_value() >= 0 &&
            a.dim_value() != b.dim_value())
          contradiction("dimension " + std::to_string(d) + " of " + std::to_string(a.dim_value()) + " against " +
                        std::to_string(b.dim_value()));
      }
    }
  };
  for (const auto& v : gp.input()) check(v, "graph input");
  for (const auto& v : gp.output()) check(v, "graph output");
  for (const auto& v : gp.value_info()) check(v, "value_info");
}

Model model_from_proto(onnx::ModelProto& proto, const std::string& name, const ImportOptions& options) {
  if (!proto.has_graph()) throw Error(name + ": the ONNX model has no graph");
  Model model;
  model.meta.source_path = name;
  model.meta.source_opset = default_opset_of(proto);
  if (model.meta.source_opset == 0) {
    throw Error(name + ": the model imports no opset of the default ONNX domain; is it an ONNX model?");
  }
  // Newer versions may change what ops mean: refuse them rather than run them with old meanings.
  if (model.meta.source_opset > kMaxOpset) {
    throw Error(name + ": default-domain opset " + std::to_string(model.meta.source_opset) +
                " is newer than Sparsebit runs (up to " + std::to_string(kMaxOpset) + "); re-export at opset " +
                std::to_string(kMaxOpset) + " or older");
  }
  if (proto.ir_version() > kMaxIrVersion) {
    throw Error(name + ": ONNX IR version " + std::to_string(proto.ir_version()) +
                " is newer than Sparsebit reads (up to " + std::to_string(kMaxIrVersion) +
                "); re-export with an older ONNX");
  }
  if (model.meta.source_opset < kMinLiftableOpset) {
    // Before 7, broadcasting followed other rules that our executor does not run.
    logs::info("{}", name + ": converting from opset " + std::to_string(model.meta.source_opset) + " to " +
                         std::to_string(kMinLiftableOpset) + " with ONNX's version converter");
    proto = convert_isolated(proto, kMinLiftableOpset, name, model.meta.source_opset);
  }
  check_declarations(proto.graph(), name);
  for (const auto& v : proto.graph().value_info()) model.meta.value_info.push_back(value_info_from_proto(v));

  const fs::path base = fs::path(name).parent_path();
  Graph& g = model.graph;
  for (const auto& o : proto.opset_import()) g.opset_imports[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  std::set<std::string> used_names;
  read_graph(proto.graph(), g, base, name, used_names, /*main=*/true, model.meta.value_types);
  try {
    g.topological_sort();
    g.validate();
    check_float8_readers(g);
  } catch (const Error& e) {
    throw Error(name + ": " + e.what());
  }
  if (options.registry) {  // what a runtime would refuse at session creation, before any work
    const OpTraitTable ops(*options.registry);
    for (const Node* n : g.nodes())
      if (const auto* checks = ops.trait<ChecksAtImport>(n->op_type, n->domain)) {
        try {
          checks->check(*n, g);
        } catch (const Error& e) {
          throw Error(name + ": " + e.what());
        }
      }
  }

  if (options.min_opset > g.default_opset()) {
    if (!options.registry)
      throw Error(name + ": ImportOptions::min_opset needs ImportOptions::registry, whose ops lift");
    try {
      const LiftReport r = lift_opset(g, options.min_opset, OpTraitTable(*options.registry),
                                      static_value_facts(g, model.meta.value_info));
      logs::info("{}", name + ": lifted from opset " + std::to_string(r.from) + " to " + std::to_string(r.to) + " (" +
                           std::to_string(r.rewrites.size()) + " node rewrites)");
      for (const auto& line : r.rewrites) logs::debug("{}", "  " + line);
    } catch (const Error& e) {
      throw Error(name + ": " + e.what());
    }
  }
  if (options.half_in_float) compute_half_precision_in_float(model, *proto.mutable_graph(), name);
  for (const auto& kv : proto.metadata_props()) model.meta.metadata_props[kv.key()] = kv.value();
  // Keep model-level fields; nodes and tensors live in the IR from now on.
  // The graph's bulk moves out first, so that the copy is of the small remainder only.
  auto* pg = proto.mutable_graph();
  onnx::GraphProto bulk;
  bulk.mutable_node()->Swap(pg->mutable_node());
  bulk.mutable_initializer()->Swap(pg->mutable_initializer());
  bulk.mutable_input()->Swap(pg->mutable_input());
  bulk.mutable_output()->Swap(pg->mutable_output());
  model.meta.skeleton = proto.SerializeAsString();
  return model;
}

}  // namespace

std::int64_t onnx_library_max_opset() {
  const auto& map = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = map.find("");
  return it == map.end() ? 0 : it->second.second;
}

namespace {
std::string read_all(std::ifstream& in) {
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  in.seekg(0, std::ios::beg);
  std::string bytes(size > 0 ? static_cast<std::size_t>(size) : 0, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

// Protobuf refuses messages nested more than 100 deep, its default, which ONNX's own readers
// keep; a file that parses with a deeper limit is a model of bodies nested too deep rather than
// a corrupt one, and is named as such.
bool parses_nested_deeper(google::protobuf::io::ZeroCopyInputStream& in) {
  google::protobuf::io::CodedInputStream coded(&in);
  coded.SetRecursionLimit(2000);
  onnx::ModelProto proto;
  return proto.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
}

[[noreturn]] void not_a_model(const std::string& name, bool nested_too_deep) {
  if (nested_too_deep)
    throw Error(name +
                ": the model nests If/Loop/Scan bodies deeper than protobuf reads by default (100 message levels, "
                "about 30 nested bodies; ONNX's readers keep that limit): re-export it with less nesting");
  throw Error(name +
              ": not a valid ONNX model (protobuf parsing failed: the file is truncated, "
              "corrupt, or of another format)");
}
}  // namespace

Model load_onnx_from_bytes(const std::string& bytes, const std::string& name, const ImportOptions& options) {
  onnx::ModelProto proto;
  if (bytes.empty()) throw Error(name + ": the file is empty, not an ONNX model");
  if (!proto.ParseFromString(bytes)) {
    google::protobuf::io::ArrayInputStream again(bytes.data(), static_cast<int>(bytes.size()));
    not_a_model(name, bytes.size() <= static_cast<std::size_t>(INT_MAX) && parses_nested_deeper(again));
  }
  return model_from_proto(proto, name, options);
}

Model load_onnx(const std::string& path, const ImportOptions& options) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error(path + ": " +
                (ec && ec != std::errc::no_such_file_or_directory ? ec.message() : std::string("no such file")));
  if (fs::is_directory(path, ec)) throw Error(path + ": is a folder, expected an .onnx file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be opened for reading");
  note_file_read(path);  // Note [Files a run read]
  if (fs::file_size(path, ec) == 0) throw Error(path + ": the file is empty, not an ONNX model");
  Model model;
  {
    onnx::ModelProto proto;
    // Parsed from the stream: the file's bytes are never held beside the parsed model.
    if (!proto.ParseFromIstream(&in)) {
      std::ifstream again(path, std::ios::binary);
      google::protobuf::io::IstreamInputStream stream(&again);
      not_a_model(path, parses_nested_deeper(stream));
    }
    model = model_from_proto(proto, path, options);
  }
  release_free_memory();  // what parsing left in the malloc heap
  return model;
}

at::Tensor load_tensor_pb(const std::string& path, std::string* name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be opened");
  note_file_read(path);
  std::string bytes = read_all(in);
  onnx::TensorProto p;
  if (!p.ParseFromString(bytes)) throw Error(path + ": not a serialized onnx.TensorProto");
  if (name) *name = p.name();
  return tensor_from_proto(p, fs::path(path).parent_path(), path);
}

at::Tensor load_value_pb(const std::string& path, const std::string& type) {
  onnx::TypeProto t;
  if (type.empty() || !t.ParseFromString(type) || (!t.has_sequence_type() && !t.has_optional_type()))
    return load_tensor_pb(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be opened");
  note_file_read(path);
  const std::string bytes = read_all(in);
  const fs::path base = fs::path(path).parent_path();
  auto sequence = [&](const onnx::SequenceProto& s, const onnx::TypeProto& of) {
    std::vector<at::Tensor> items;
    for (const auto& e : s.tensor_values()) items.push_back(tensor_from_proto(e, base, path));
    const std::int32_t elem = of.sequence_type().elem_type().tensor_type().elem_type();
    return sequence_of(items,
                       items.empty() ? proto::scalar_type_of(elem == 0 ? 1 : elem, path) : items[0].scalar_type());
  };
  if (t.has_sequence_type()) {
    onnx::SequenceProto s;
    if (!s.ParseFromString(bytes)) throw Error(path + ": not a serialized onnx.SequenceProto");
    return sequence(s, t);
  }
  onnx::OptionalProto o;
  if (!o.ParseFromString(bytes)) throw Error(path + ": not a serialized onnx.OptionalProto");
  if (o.has_tensor_value()) return tensor_from_proto(o.tensor_value(), base, path);
  if (o.has_sequence_value()) return sequence(o.sequence_value(), t.optional_type().elem_type());
  return {};
}

}  // namespace sparsebit
