#include "graph/half_precision.h"

#include <ATen/ATen.h>

#include <functional>

#include "base/core_ops.h"
#include "base/log.h"
#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {
namespace {

constexpr std::int32_t kFloat32 = onnx::TensorProto::FLOAT;

bool is_half(std::int32_t elem_type) {
  return elem_type == onnx::TensorProto::FLOAT16 || elem_type == onnx::TensorProto::BFLOAT16;
}
bool is_half(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

bool uses_half(const Graph& g) {
  for (const auto& v : g.inputs)
    if (is_half(v.elem_type)) return true;
  for (const auto& v : g.outputs)
    if (is_half(v.elem_type)) return true;
  for (const auto& kv : g.initializers)
    if (is_half(kv.second)) return true;
  for (const Node* n : g.nodes())
    for (const auto& kv : n->attributes) {
      const Attribute& a = kv.second;
      if ((a.kind == Attribute::Kind::kTensor && is_half(a.t)) ||
          (a.kind == Attribute::Kind::kGraph && a.graph && uses_half(*a.graph)) ||
          (a.kind == Attribute::Kind::kInt && (kv.first == "to" || kv.first == "dtype") && is_half(a.i)))
        return true;
    }
  return false;
}

void to_float(Graph& g) {
  for (auto& kv : g.initializers)
    if (is_half(kv.second)) kv.second = kv.second.to(at::kFloat);
  for (auto* values : {&g.inputs, &g.outputs})
    for (auto& v : *values)
      if (is_half(v.elem_type)) v.elem_type = kFloat32;
  for (Node* n : g.nodes())
    for (auto& kv : n->attributes) {
      Attribute& a = kv.second;
      if (a.kind == Attribute::Kind::kTensor && is_half(a.t)) a.t = a.t.to(at::kFloat);
      else if (a.kind == Attribute::Kind::kGraph && a.graph) to_float(*a.graph);
      else if (a.kind == Attribute::Kind::kInt && (kv.first == "to" || kv.first == "dtype") && is_half(a.i))
        a.i = kFloat32;
    }
}

void to_float(onnx::TypeProto& t) {
  if (t.has_tensor_type() && is_half(t.tensor_type().elem_type())) t.mutable_tensor_type()->set_elem_type(kFloat32);
  if (t.has_sequence_type()) to_float(*t.mutable_sequence_type()->mutable_elem_type());
  if (t.has_optional_type()) to_float(*t.mutable_optional_type()->mutable_elem_type());
}

}  // namespace

void compute_half_precision_in_float(Model& model, onnx::GraphProto& proto_graph, const std::string& name) {
  Graph& g = model.graph;
  if (!uses_half(g)) return;
  for (const auto* values : {&g.inputs, &g.outputs})
    for (const auto& v : *values)
      if (is_half(v.elem_type)) model.meta.interface_types[v.name] = v.elem_type;
  to_float(g);
  for (auto& v : model.meta.value_info)
    if (is_half(v.elem_type)) v.elem_type = kFloat32;
  for (auto& v : *proto_graph.mutable_value_info()) to_float(*v.mutable_type());
  for (auto& kv : model.meta.value_types) {
    onnx::TypeProto t;
    if (!t.ParseFromString(kv.second)) continue;
    to_float(t);
    kv.second = t.SerializeAsString();
  }
  logs::info("{}", name +
                       ": float16/bfloat16 values are computed in float32 (Note [Half-precision models]); the "
                       "export keeps the model's input and output types");
}

void restore_half_precision_interface(Graph& g, const ModelMeta& meta) {
  if (meta.interface_types.empty()) return;
  const Node* first = g.num_nodes() ? g.nodes().front() : nullptr;
  for (auto& v : g.inputs) {
    auto t = meta.interface_types.find(v.name);
    if (t == meta.interface_types.end() || v.elem_type != kFloat32) continue;
    const std::string inside = g.unique_name(v.name + "_float32");
    g.replace_all_uses(v.name, inside);
    Node cast;
    cast.name = g.unique_name(v.name + "_to_float32");
    cast.op_type = std::string(core_ops::kCast);
    cast.inputs = {v.name};
    cast.outputs = {inside};
    cast.attributes["to"] = Attribute::of_int(kFloat32);
    first ? g.insert_before(first, std::move(cast)) : g.append(std::move(cast));
    v.elem_type = t->second;
  }
  for (auto& v : g.outputs) {
    auto t = meta.interface_types.find(v.name);
    Node* producer = g.producer(v.name);
    if (t == meta.interface_types.end() || v.elem_type != kFloat32 || !producer) continue;
    const std::string output = v.name, inside = g.unique_name(v.name + "_float32");
    g.replace_all_uses(output, inside);  // readers inside the graph, and the graph output for now
    for (auto& o : producer->outputs)
      if (o == output) o = inside;
    v.name = output;
    Node cast;
    cast.name = g.unique_name(output + "_to_model_type");
    cast.op_type = std::string(core_ops::kCast);
    cast.inputs = {inside};
    cast.outputs = {output};
    cast.attributes["to"] = Attribute::of_int(t->second);
    g.append(std::move(cast));
    v.elem_type = t->second;
  }
}

}  // namespace sparsebit
