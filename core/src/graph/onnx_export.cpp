// ONNX export: a Graph and its model's metadata serialized as a ModelProto (bodies typed,
// ONNX's checker run), large initializers moved to an external-data side file, the files
// written atomically.

#include <ATen/ATen.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "base/limits.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "graph/half_precision.h"
#include "graph/onnx_proto.h"
#include "graph/run_isolated.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace fs = std::filesystem;

using proto::attribute_to_proto;
using proto::kInt4;
using proto::kUint4;
using proto::tensor_to_proto;
using proto::value_info_to_proto;

namespace {

/// The lowest IR version that can hold default-domain opset `opset`.
std::int64_t min_ir_version_for(std::int64_t opset) {
  if (opset >= 21) return 10;
  if (opset >= 19) return 9;
  if (opset >= 14) return 8;
  return 7;
}

}  // namespace

namespace {
/// Writes the nodes of `graph` into `gp` (subgraphs as GraphProto attributes, with their own
/// inputs, outputs and initializers), collecting the names of node outputs in `names`.
// A graph or body input/output: its tensor type, or the sequence/optional type it was imported with.
void write_value_info(const ValueInfo& v, onnx::ValueInfoProto* p, const std::map<std::string, std::string>& types) {
  value_info_to_proto(v, p);
  if (auto t = types.find(v.name); t != types.end() && !p->mutable_type()->ParseFromString(t->second))
    throw Error("internal: bad type of '" + v.name + "'");
}

void write_nodes(const Graph& graph, onnx::GraphProto* gp, std::set<std::string>& names,
                 const std::map<std::string, std::string>& types) {
  for (const auto* n : graph.nodes()) {
    auto* np = gp->add_node();
    np->set_name(n->name);
    np->set_op_type(n->op_type);
    if (!n->domain.empty()) np->set_domain(n->domain);
    for (auto& s : n->inputs) np->add_input(s);
    for (auto& s : n->outputs) {
      np->add_output(s);
      names.insert(s);
    }
    if (!n->doc_string.empty()) np->set_doc_string(n->doc_string);
    for (const auto& kv : n->attributes) {
      if (kv.second.kind != Attribute::Kind::kGraph) {
        attribute_to_proto(kv.first, kv.second, np->add_attribute());
        continue;
      }
      auto* ap = np->add_attribute();
      ap->set_name(kv.first);
      ap->set_type(onnx::AttributeProto::GRAPH);
      const Graph& sub = *kv.second.graph;
      auto* sp = ap->mutable_g();
      sp->set_name(n->name + "_" + kv.first);
      for (const auto& v : sub.inputs) write_value_info(v, sp->add_input(), types);
      for (const auto& v : sub.outputs) write_value_info(v, sp->add_output(), types);
      for (const auto& init : sub.initializers) {
        auto narrow = sub.narrow_types.find(init.first);
        tensor_to_proto(init.second, init.first, sp->add_initializer(),
                        narrow == sub.narrow_types.end() ? 0 : narrow->second);
      }
      write_nodes(sub, sp, names, types);
    }
  }
}
}  // namespace

onnx::ModelProto proto::structure_of(const Graph& graph, std::int64_t inline_elements) {
  onnx::ModelProto m;
  m.set_ir_version(std::max<std::int64_t>(7, min_ir_version_for(graph.default_opset())));
  for (const auto& kv : graph.opset_imports) {
    auto* o = m.add_opset_import();
    o->set_domain(kv.first);
    o->set_version(kv.second);
  }
  auto* gp = m.mutable_graph();
  gp->set_name("structure");
  const std::map<std::string, std::string> no_types;
  for (const auto& v : graph.inputs) write_value_info(v, gp->add_input(), no_types);
  for (const auto& v : graph.outputs) write_value_info(v, gp->add_output(), no_types);
  for (const auto& [name, t] : graph.initializers) {
    auto narrow = graph.narrow_types.find(name);
    const std::int32_t narrow_type = narrow == graph.narrow_types.end() ? 0 : narrow->second;
    if (t.numel() <= inline_elements) {
      tensor_to_proto(t, name, gp->add_initializer(), narrow_type);
      continue;
    }
    ValueInfo v;
    v.name = name;
    v.elem_type = narrow_type ? narrow_type : onnx_type_of(t.scalar_type());
    v.has_shape = true;
    for (auto d : t.sizes()) v.shape.push_back(Dim{d, ""});
    value_info_to_proto(v, gp->add_input());
  }
  std::set<std::string> names;
  write_nodes(graph, gp, names, no_types);
  return m;
}

namespace {
bool untyped(const onnx::ValueInfoProto& v) {
  const auto& t = v.type();
  return t.value_case() == onnx::TypeProto::VALUE_NOT_SET || (t.has_tensor_type() && t.tensor_type().elem_type() == 0);
}

/// Every control-flow body under `g`, outermost first.
void bodies(onnx::GraphProto& g, std::vector<onnx::GraphProto*>& out) {
  for (auto& n : *g.mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) {
        out.push_back(a.mutable_g());
        bodies(*a.mutable_g(), out);
      }
      for (auto& sub : *a.mutable_graphs()) {
        out.push_back(&sub);
        bodies(sub, out);
      }
    }
}

/// Note [Types of body values]
/// Exporters often leave the inputs and outputs of If/Loop/Scan bodies untyped (torch's
/// scripted exports nested four deep, for one); ONNX Runtime infers them when it reads the
/// original, but refuses a type written with element type 0. Those the model leaves untyped are
/// filled from ONNX's type inference (run isolated, as the opset lift is), and any it cannot
/// infer are written with no type at all, as the model had them.
void type_body_values(onnx::ModelProto& proto) {
  std::vector<onnx::GraphProto*> mine;
  bodies(*proto.mutable_graph(), mine);
  bool missing = false;
  for (const auto* b : mine) {
    for (const auto& v : b->input()) missing = missing || untyped(v);
    for (const auto& v : b->output()) missing = missing || untyped(v);
  }
  if (!missing) return;
  int status = 0;
  const std::string result = run_isolated(
      proto,
      [](onnx::ModelProto& m) {
        onnx::shape_inference::InferShapes(m);
        return m;
      },
      status);
  onnx::ModelProto inferred;
  std::vector<onnx::GraphProto*> theirs;
  if (!result.empty() && result[0] == '1' &&
      inferred.ParseFromArray(result.data() + 1, static_cast<int>(result.size() - 1))) {
    bodies(*inferred.mutable_graph(), theirs);
  } else {
    logs::debug("{}", "ONNX's type inference did not run on the export; untyped body values stay untyped");
  }
  auto fill = [](google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& values,
                 const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* from) {
    for (int i = 0; i < values.size(); ++i) {
      auto& v = values[i];
      if (!untyped(v)) continue;
      if (from && i < from->size() && from->Get(i).name() == v.name() && !untyped(from->Get(i)))
        *v.mutable_type() = from->Get(i).type();
      else v.clear_type();
    }
  };
  const bool aligned = theirs.size() == mine.size();
  for (std::size_t b = 0; b < mine.size(); ++b) {
    fill(*mine[b]->mutable_input(), aligned ? &theirs[b]->input() : nullptr);
    fill(*mine[b]->mutable_output(), aligned ? &theirs[b]->output() : nullptr);
  }
}
}  // namespace

namespace {
// Note [ONNX Runtime's default-domain ops]
// ONNX Runtime registers SimplifiedLayerNormalization (RMS normalization, written by its
// transformer optimizer and Optimum) in the default domain, where ONNX's checker knows no such
// op and refuses the model. Its schema is registered here, once, as ONNX Runtime defines it, so
// such models round-trip; the op itself is the contrib plugin's.
void register_runtime_schemas() {
  static const bool registered = [] {
    using onnx::AttributeProto;
    onnx::OpSchema s;
    s.SetName("SimplifiedLayerNormalization")
        .SetDomain("")
        .SinceVersion(1)
        .SetDoc("ONNX Runtime's root-mean-square layer normalization")
        .Attr("axis", "first normalized axis", AttributeProto::INT, static_cast<std::int64_t>(-1))
        .Attr("epsilon", "added to the mean square", AttributeProto::FLOAT, 1e-5f)
        .Attr("stash_type", "type of the statistics", AttributeProto::INT, static_cast<std::int64_t>(1))
        .Input(0, "X", "input", "T")
        .Input(1, "scale", "scale", "V")
        .Output(0, "Y", "output", "V")
        .Output(1, "inv_std_var", "reciprocal root mean square", "U", onnx::OpSchema::Optional)
        .TypeConstraint("T", {"tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"}, "input")
        .TypeConstraint("U", {"tensor(float)", "tensor(double)"}, "statistics")
        .TypeConstraint("V", {"tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"}, "output")
        .TypeAndShapeInferenceFunction([](onnx::InferenceContext& ctx) {
          onnx::propagateElemTypeFromInputToOutput(ctx, 1, 0);
          if (onnx::hasInputShape(ctx, 0)) onnx::propagateShapeFromInputToOutput(ctx, 0, 0);
        });
    onnx::OpSchemaRegistry::OpSchemaRegisterOnce once(s);
    return true;
  }();
  (void)registered;
}
}  // namespace

std::string serialize_onnx(const Graph& graph, const ModelMeta& meta, const ExportOptions& options,
                           std::string* external, const std::string& external_location) {
  if (!meta.interface_types.empty()) {  // Note [Half-precision models]
    Graph wrapped = graph.clone();
    restore_half_precision_interface(wrapped, meta);
    ModelMeta plain = meta;
    plain.interface_types.clear();
    return serialize_onnx(wrapped, plain, options, external, external_location);
  }
  onnx::ModelProto proto;
  if (!meta.skeleton.empty() && !proto.ParseFromString(meta.skeleton)) throw Error("internal: bad model skeleton");
  if (proto.ir_version() == 0) proto.set_ir_version(7);
  if (proto.producer_name().empty()) proto.set_producer_name("sparsebit");
  proto.clear_opset_import();
  for (const auto& kv : graph.opset_imports) {
    auto* o = proto.add_opset_import();
    o->set_domain(kv.first);
    o->set_version(kv.second);
  }
  const std::int64_t opset = graph.default_opset();
  proto.set_ir_version(std::max<std::int64_t>(proto.ir_version(), min_ir_version_for(opset)));
  for (const auto& kv : options.metadata_props) {
    const std::string& key = kv.first;
    auto* props = proto.mutable_metadata_props();
    auto it = std::find_if(props->begin(), props->end(),
                           [&](const onnx::StringStringEntryProto& e) { return e.key() == key; });
    onnx::StringStringEntryProto* entry = it != props->end() ? &*it : proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(kv.second);
  }

  auto* gp = proto.mutable_graph();
  if (gp->name().empty()) gp->set_name("graph");
  for (const auto& v : graph.inputs) write_value_info(v, gp->add_input(), meta.value_types);
  for (const auto& v : graph.outputs) write_value_info(v, gp->add_output(), meta.value_types);
  std::int64_t total = 0;
  for (const auto& kv : graph.initializers) total += static_cast<std::int64_t>(kv.second.nbytes());
  const bool to_side_file = external != nullptr && (options.external_data || total > options.external_threshold_bytes);
  if (to_side_file && external_location.empty()) throw Error("internal: external data needs a location");
  if (external) external->clear();
  for (const auto& kv : graph.initializers) {
    auto narrow = graph.narrow_types.find(kv.first);
    tensor_to_proto(kv.second, kv.first, gp->add_initializer(),
                    narrow == graph.narrow_types.end() ? 0 : narrow->second);
    page_out(kv.second);  // Note [Mapped weights]
  }
  std::set<std::string> names;
  write_nodes(graph, gp, names, meta.value_types);
  // Drop shape annotations of tensors that no longer exist.
  auto* vi = gp->mutable_value_info();
  for (int i = vi->size() - 1; i >= 0; --i)
    if (!names.count(vi->Get(i).name())) vi->DeleteSubrange(i, 1);
  type_body_values(proto);  // Note [Types of body values]

  if (options.run_checker) {
    register_runtime_schemas();  // Note [ONNX Runtime's default-domain ops]
    if (opset <= onnx_library_max_opset() && proto.ir_version() <= onnx::IR_VERSION) {
      try {
        onnx::checker::check_model(proto);
      } catch (const std::exception& e) {
        throw Error(std::string("the exported model fails ONNX's checker: ") + e.what());
      }
    } else {
      logs::info("{}", "opset " + std::to_string(opset) + " is newer than the installed ONNX checker knows (" +
                           std::to_string(onnx_library_max_opset()) + "); the checker was skipped");
    }
  }
  // After the checker (which would look for the side file): large initializers move out.
  for (auto& tp : *gp->mutable_initializer()) {
    if (!to_side_file || !tp.has_raw_data() ||
        static_cast<std::int64_t>(tp.raw_data().size()) < options.external_min_bytes)
      continue;
    external->resize((external->size() + 4095) / 4096 * 4096, '\0');  // mappable offsets
    const std::size_t offset = external->size();
    external->append(tp.raw_data());
    tp.clear_raw_data();
    tp.set_data_location(onnx::TensorProto::EXTERNAL);
    const std::pair<const char*, std::string> entries[] = {{"location", external_location},
                                                           {"offset", std::to_string(offset)},
                                                           {"length", std::to_string(external->size() - offset)}};
    for (const auto& [k, v] : entries) {
      auto* e = tp.add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
  }
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) {
    throw Error(
        "the model could not be serialized: protobuf messages stop at 2 GiB; write it with external data "
        "(`--external-data`, or save_onnx, which switches automatically)");
  }
  return bytes;
}

std::string default_side_file(const std::string& model_path) {
  return fs::path(model_path).filename().string() + ".data";
}

bool write_side_file(const std::string& model_path, const std::string& bytes, const std::string& location) {
  if (bytes.empty()) return false;
  AtomicFile data(
      (fs::path(model_path).parent_path() / (location.empty() ? default_side_file(model_path) : location)).string());
  data.write(bytes);
  data.commit();
  return true;
}

void write_onnx_files(const std::string& path, const std::string& model_bytes, const std::string& external_bytes,
                      const std::string& location) {
  AtomicFile out(path);  // claimed first: an unwritable model path fails before the side file is written
  out.write(model_bytes);
  write_side_file(path, external_bytes, location);
  out.commit();
}

void save_onnx(const Graph& graph, const ModelMeta& meta, const std::string& path, const ExportOptions& options) {
  std::string external;
  const std::string model = serialize_onnx(graph, meta, options, &external, default_side_file(path));
  write_onnx_files(path, model, external);
}

}  // namespace sparsebit
