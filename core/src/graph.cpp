#include "sparsebit/sdk/graph.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <list>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "sparsebit/sdk/error.h"

namespace sparsebit {

// ---------------------------------------------------------------------------------------------
// Attribute

Attribute Attribute::of_int(std::int64_t v) {
  Attribute a;
  a.kind = Kind::kInt;
  a.i = v;
  return a;
}
Attribute Attribute::of_float(double v) {
  Attribute a;
  a.kind = Kind::kFloat;
  a.f = v;
  return a;
}
Attribute Attribute::of_string(std::string v) {
  Attribute a;
  a.kind = Kind::kString;
  a.s = std::move(v);
  return a;
}
Attribute Attribute::of_ints(std::vector<std::int64_t> v) {
  Attribute a;
  a.kind = Kind::kInts;
  a.ints = std::move(v);
  return a;
}
Attribute Attribute::of_floats(std::vector<double> v) {
  Attribute a;
  a.kind = Kind::kFloats;
  a.floats = std::move(v);
  return a;
}
Attribute Attribute::of_tensor(at::Tensor v) {
  Attribute a;
  a.kind = Kind::kTensor;
  a.t = std::move(v);
  return a;
}

const char* Attribute::kind_name() const {
  switch (kind) {
    case Kind::kFloat: return "float";
    case Kind::kInt: return "int";
    case Kind::kString: return "string";
    case Kind::kTensor: return "tensor";
    case Kind::kFloats: return "floats";
    case Kind::kInts: return "ints";
    case Kind::kStrings: return "strings";
    case Kind::kOpaque: return "graph/sparse/type";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Node

std::string Node::describe() const {
  return "node '" + name + "' (" + (domain.empty() ? "" : domain + ":") + op_type + ")";
}

namespace {
const Attribute* typed_attr(const Node& n, const std::string& key, Attribute::Kind kind,
                            const char* wanted) {
  auto it = n.attributes.find(key);
  if (it == n.attributes.end()) return nullptr;
  if (it->second.kind != kind) {
    throw Error(n.describe() + ": attribute '" + key + "' is " + it->second.kind_name() +
                ", expected " + wanted + "; the model does not follow the ONNX spec for " +
                n.op_type);
  }
  return &it->second;
}
}  // namespace

std::int64_t Node::attr_int(const std::string& key, std::int64_t fallback) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kInt, "int");
  return a ? a->i : fallback;
}
double Node::attr_float(const std::string& key, double fallback) const {
  auto it = attributes.find(key);
  // Some exporters write integral values for float attributes; accept them.
  if (it != attributes.end() && it->second.kind == Attribute::Kind::kInt) return double(it->second.i);
  auto* a = typed_attr(*this, key, Attribute::Kind::kFloat, "float");
  return a ? a->f : fallback;
}
std::string Node::attr_string(const std::string& key, const std::string& fallback) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kString, "string");
  return a ? a->s : fallback;
}
std::vector<std::int64_t> Node::attr_ints(const std::string& key,
                                          const std::vector<std::int64_t>& fallback) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kInts, "ints");
  return a ? a->ints : fallback;
}
std::vector<double> Node::attr_floats(const std::string& key,
                                      const std::vector<double>& fallback) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kFloats, "floats");
  return a ? a->floats : fallback;
}
at::Tensor Node::attr_tensor(const std::string& key) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kTensor, "tensor");
  return a ? a->t : at::Tensor();
}

// ---------------------------------------------------------------------------------------------
// Graph

struct Graph::Impl {
  // A list keeps Node addresses stable across insertions and erasures.
  std::list<Node> nodes;

  std::list<Node>::iterator find(const Node* n) {
    for (auto it = nodes.begin(); it != nodes.end(); ++it)
      if (&*it == n) return it;
    throw Error("internal: node is not part of this graph");
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Graph Graph::clone() const {
  Graph g;
  g.inputs = inputs;
  g.outputs = outputs;
  g.initializers = initializers;
  g.narrow_types = narrow_types;
  g.opset_imports = opset_imports;
  g.impl_->nodes = impl_->nodes;
  return g;
}

std::int64_t Graph::default_opset() const {
  for (const char* d : {"", "ai.onnx"}) {
    auto it = opset_imports.find(d);
    if (it != opset_imports.end()) return it->second;
  }
  return 0;
}

std::size_t Graph::num_nodes() const { return impl_->nodes.size(); }

Node& Graph::node(std::size_t index) {
  if (index >= impl_->nodes.size()) throw Error("internal: node index out of range");
  return *std::next(impl_->nodes.begin(), static_cast<long>(index));
}
const Node& Graph::node(std::size_t index) const {
  if (index >= impl_->nodes.size()) throw Error("internal: node index out of range");
  return *std::next(impl_->nodes.begin(), static_cast<long>(index));
}

std::vector<Node*> Graph::nodes() {
  std::vector<Node*> out;
  out.reserve(impl_->nodes.size());
  for (auto& n : impl_->nodes) out.push_back(&n);
  return out;
}
std::vector<const Node*> Graph::nodes() const {
  std::vector<const Node*> out;
  out.reserve(impl_->nodes.size());
  for (auto& n : impl_->nodes) out.push_back(&n);
  return out;
}

Node* Graph::find_node(const std::string& name) {
  for (auto& n : impl_->nodes)
    if (n.name == name) return &n;
  return nullptr;
}

Node* Graph::append(Node n) {
  impl_->nodes.push_back(std::move(n));
  return &impl_->nodes.back();
}
Node* Graph::insert_before(const Node* position, Node n) {
  return &*impl_->nodes.insert(impl_->find(position), std::move(n));
}
Node* Graph::insert_after(const Node* position, Node n) {
  return &*impl_->nodes.insert(std::next(impl_->find(position)), std::move(n));
}
void Graph::erase(const Node* n) { impl_->nodes.erase(impl_->find(n)); }

Node* Graph::producer(const std::string& value) {
  if (value.empty()) return nullptr;
  for (auto& n : impl_->nodes)
    for (auto& o : n.outputs)
      if (o == value) return &n;
  return nullptr;
}

std::vector<std::pair<Node*, std::size_t>> Graph::consumers(const std::string& value) {
  std::vector<std::pair<Node*, std::size_t>> out;
  if (value.empty()) return out;
  for (auto& n : impl_->nodes)
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] == value) out.emplace_back(&n, i);
  return out;
}

bool Graph::is_graph_output(const std::string& value) const {
  return std::any_of(outputs.begin(), outputs.end(), [&](const ValueInfo& v) { return v.name == value; });
}
bool Graph::is_graph_input(const std::string& value) const {
  return std::any_of(inputs.begin(), inputs.end(), [&](const ValueInfo& v) { return v.name == value; });
}

void Graph::replace_all_uses(const std::string& from, const std::string& to) {
  for (auto& n : impl_->nodes)
    for (auto& in : n.inputs)
      if (in == from) in = to;
  for (auto& o : outputs)
    if (o.name == from) o.name = to;
}

std::string Graph::unique_name(const std::string& base) const {
  std::unordered_set<std::string> used;
  for (auto& v : inputs) used.insert(v.name);
  for (auto& v : outputs) used.insert(v.name);
  for (auto& kv : initializers) used.insert(kv.first);
  for (auto& n : impl_->nodes) {
    used.insert(n.name);
    for (auto& s : n.inputs) used.insert(s);
    for (auto& s : n.outputs) used.insert(s);
  }
  if (!used.count(base)) return base;
  for (int k = 1;; ++k) {
    std::string candidate = base + "_" + std::to_string(k);
    if (!used.count(candidate)) return candidate;
  }
}

void Graph::topological_sort() {
  std::unordered_map<std::string, const Node*> producer_of;
  for (auto& n : impl_->nodes)
    for (auto& o : n.outputs)
      if (!o.empty()) producer_of[o] = &n;

  std::unordered_set<std::string> available;
  for (auto& v : inputs) available.insert(v.name);
  for (auto& kv : initializers) available.insert(kv.first);

  // Kahn's algorithm that always picks the earliest ready node, so an already sorted graph
  // keeps its order exactly.
  std::list<Node> pending;
  pending.splice(pending.end(), impl_->nodes);
  std::list<Node> sorted;
  while (!pending.empty()) {
    bool progressed = false;
    for (auto it = pending.begin(); it != pending.end();) {
      bool ready = std::all_of(it->inputs.begin(), it->inputs.end(), [&](const std::string& in) {
        return in.empty() || available.count(in) || !producer_of.count(in);
      });
      if (!ready) {
        ++it;
        continue;
      }
      for (auto& o : it->outputs) available.insert(o);
      auto next = std::next(it);
      sorted.splice(sorted.end(), pending, it);
      it = next;
      progressed = true;
      break;  // restart from the front to stay stable
    }
    if (!progressed) {
      const Node& stuck = pending.front();
      impl_->nodes.splice(impl_->nodes.end(), sorted);
      impl_->nodes.splice(impl_->nodes.end(), pending);
      throw Error("the graph has a cycle through " + stuck.describe() +
                  "; ONNX graphs must be acyclic");
    }
  }
  impl_->nodes.swap(sorted);
}

std::size_t Graph::prune_dead() {
  std::size_t removed = 0;
  bool changed = true;
  while (changed) {
    changed = false;
    std::unordered_set<std::string> read;
    for (auto& o : outputs) read.insert(o.name);
    for (auto& n : impl_->nodes)
      for (auto& in : n.inputs) read.insert(in);
    for (auto it = impl_->nodes.begin(); it != impl_->nodes.end();) {
      bool used = std::any_of(it->outputs.begin(), it->outputs.end(),
                              [&](const std::string& o) { return !o.empty() && read.count(o); });
      if (!used) {
        it = impl_->nodes.erase(it);
        ++removed;
        changed = true;
      } else {
        ++it;
      }
    }
    for (auto it = initializers.begin(); it != initializers.end();) {
      if (!read.count(it->first))
        it = initializers.erase(it);
      else
        ++it;
    }
  }
  return removed;
}

void Graph::validate() const {
  std::unordered_map<std::string, std::string> defined;  // name -> who defines it
  auto define = [&](const std::string& name, const std::string& who) {
    if (name.empty()) return;
    auto [it, fresh] = defined.emplace(name, who);
    if (!fresh && it->second != who)
      throw Error("tensor '" + name + "' is defined twice: by " + it->second + " and by " + who);
  };
  for (auto& v : inputs) define(v.name, "graph input");
  for (auto& kv : initializers)
    if (!defined.count(kv.first)) define(kv.first, "initializer");
  for (auto& n : impl_->nodes)
    for (auto& o : n.outputs) define(o, n.describe());
  for (auto& n : impl_->nodes)
    for (auto& in : n.inputs)
      if (!in.empty() && !defined.count(in))
        throw Error(n.describe() + " reads tensor '" + in +
                    "' that no node, graph input or initializer produces");
  for (auto& o : outputs)
    if (!defined.count(o.name)) throw Error("graph output '" + o.name + "' is never produced");
}

}  // namespace sparsebit
