#include "sparsebit/sdk/graph.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <list>
#include <queue>
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

Attribute Attribute::of_graph(Graph g) {
  Attribute a;
  a.kind = Kind::kGraph;
  a.graph = std::make_shared<Graph>(std::move(g));
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
    case Kind::kOpaque: return "graphs/sparse/type";
    case Kind::kGraph: return "graph";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Node

std::string Node::describe() const {
  return "node '" + printable(name) + "' (" + (domain.empty() ? "" : printable(domain) + ":") + printable(op_type) +
         ")";
}

std::vector<const Graph*> Node::subgraphs() const {
  std::vector<const Graph*> out;
  for (const auto& kv : attributes)
    if (kv.second.kind == Attribute::Kind::kGraph && kv.second.graph) out.push_back(kv.second.graph.get());
  return out;
}

std::vector<std::string> Node::implicit_inputs() const {
  std::set<std::string> names;
  for (const Graph* g : subgraphs())
    for (auto& name : g->outer_reads()) names.insert(name);
  return {names.begin(), names.end()};
}

namespace {
const Attribute* typed_attr(const Node& n, const std::string& key, Attribute::Kind kind, const char* wanted) {
  auto it = n.attributes.find(key);
  if (it == n.attributes.end()) return nullptr;
  if (it->second.kind != kind) {
    throw Error(n.describe() + ": attribute '" + key + "' is " + it->second.kind_name() + ", expected " + wanted +
                "; the model does not follow the ONNX spec for " + n.op_type);
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
std::vector<std::int64_t> Node::attr_ints(const std::string& key, const std::vector<std::int64_t>& fallback) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kInts, "ints");
  return a ? a->ints : fallback;
}
std::vector<double> Node::attr_floats(const std::string& key, const std::vector<double>& fallback) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kFloats, "floats");
  return a ? a->floats : fallback;
}
at::Tensor Node::attr_tensor(const std::string& key) const {
  auto* a = typed_attr(*this, key, Attribute::Kind::kTensor, "tensor");
  return a ? a->t : at::Tensor();
}

// ---------------------------------------------------------------------------------------------
// Graph

// Note [Graph indexes]
// Every query a pass or the exporter makes in a loop is amortised O(1): node positions (for
// insert/erase), the index -> node order, and unique_name(). The names unique_name() must avoid
// live in four places: initializers, graph inputs and outputs are looked up directly (maps and
// short lists); node names, inputs and outputs are indexed once and the index grows with every
// node added through append/insert and every name handed out (names of erased nodes stay taken,
// which is harmless). A name written straight into a Node's fields that is neither handed out
// nor produced by a node added through the Graph is not seen; if it ever clashed with a handed
// out name, two producers would exist and validate() would refuse the graph.
struct Graph::Impl {
  // A list keeps Node addresses stable across insertions and erasures.
  std::list<Node> nodes;
  std::unordered_map<const Node*, std::list<Node>::iterator> where;
  std::uint64_t changes = 0;  ///< structural changes so far

  mutable std::vector<Node*> order;  ///< index -> node, valid while order_at == changes
  mutable std::uint64_t order_at = ~std::uint64_t{0};
  mutable std::unordered_set<std::string> used;  ///< node names and values (Note [Graph indexes])
  mutable std::unordered_map<std::string, std::int64_t> next_suffix;
  mutable bool used_valid = false;

  void index_names(const Node& n) const {
    used.insert(n.name);
    for (auto& v : n.inputs) used.insert(v);
    for (auto& v : n.outputs) used.insert(v);
    for (const Graph* g : n.subgraphs()) index_subgraph(*g);
  }
  // Names of every nesting level are taken (Note [Subgraphs]).
  void index_subgraph(const Graph& g) const {
    for (auto& v : g.inputs) used.insert(v.name);
    for (auto& v : g.outputs) used.insert(v.name);
    for (auto& kv : g.initializers) used.insert(kv.first);
    for (const Node* n : g.nodes()) index_names(*n);
  }
  std::list<Node>::iterator find(const Node* n) {
    auto it = where.find(n);
    if (it == where.end()) throw Error("internal: node is not part of this graph");
    return it->second;
  }
  Node* add(std::list<Node>::iterator it) {
    where[&*it] = it;
    ++changes;
    if (used_valid) index_names(*it);
    return &*it;
  }
  void reindex() {
    where.clear();
    for (auto it = nodes.begin(); it != nodes.end(); ++it) where[&*it] = it;
    ++changes;
  }
  const std::vector<Node*>& ordered() const {
    if (order_at != changes) {
      order.clear();
      order.reserve(nodes.size());
      for (auto& n : const_cast<std::list<Node>&>(nodes)) order.push_back(&n);
      order_at = changes;
    }
    return order;
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
  for (auto& n : g.impl_->nodes)
    for (auto& kv : n.attributes)
      if (kv.second.kind == Attribute::Kind::kGraph && kv.second.graph)
        kv.second.graph = std::make_shared<Graph>(kv.second.graph->clone());
  g.impl_->reindex();
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
  const auto& order = impl_->ordered();
  if (index >= order.size()) throw Error("internal: node index out of range");
  return *order[index];
}
const Node& Graph::node(std::size_t index) const {
  const auto& order = impl_->ordered();
  if (index >= order.size()) throw Error("internal: node index out of range");
  return *order[index];
}

std::vector<Node*> Graph::nodes() { return impl_->ordered(); }
std::vector<const Node*> Graph::nodes() const {
  const auto& order = impl_->ordered();
  return std::vector<const Node*>(order.begin(), order.end());
}

Node* Graph::find_node(const std::string& name) {
  for (auto& n : impl_->nodes)
    if (n.name == name) return &n;
  return nullptr;
}

Node* Graph::append(Node n) { return impl_->add(impl_->nodes.insert(impl_->nodes.end(), std::move(n))); }
Node* Graph::insert_before(const Node* position, Node n) {
  return impl_->add(impl_->nodes.insert(impl_->find(position), std::move(n)));
}
Node* Graph::insert_after(const Node* position, Node n) {
  return impl_->add(impl_->nodes.insert(std::next(impl_->find(position)), std::move(n)));
}
void Graph::erase(const Node* n) {
  auto it = impl_->find(n);
  impl_->where.erase(n);
  impl_->nodes.erase(it);
  ++impl_->changes;
}

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

// The const queries share the scans above; nothing is modified through the cast.
const Node* Graph::producer(const std::string& value) const { return const_cast<Graph*>(this)->producer(value); }

std::vector<std::pair<const Node*, std::size_t>> Graph::consumers(const std::string& value) const {
  const auto found = const_cast<Graph*>(this)->consumers(value);
  return {found.begin(), found.end()};
}

bool Graph::is_graph_output(const std::string& value) const {
  return std::any_of(outputs.begin(), outputs.end(), [&](const ValueInfo& v) { return v.name == value; });
}
bool Graph::is_graph_input(const std::string& value) const {
  return std::any_of(inputs.begin(), inputs.end(), [&](const ValueInfo& v) { return v.name == value; });
}

namespace {
bool defines(const Graph& g, const std::string& name) {
  if (g.initializers.count(name) || g.is_graph_input(name)) return true;
  for (const Node* n : g.nodes())
    for (auto& o : n->outputs)
      if (o == name) return true;
  return false;
}

// Renames reads of an enclosing scope's value inside the subgraphs of `n`, down to where a
// level defines the name itself.
void rename_in_subgraphs(Node& n, const std::string& from, const std::string& to) {
  for (auto& kv : n.attributes) {
    if (kv.second.kind != Attribute::Kind::kGraph || !kv.second.graph || defines(*kv.second.graph, from)) continue;
    Graph& g = *kv.second.graph;
    for (Node* inner : g.nodes()) {
      for (auto& in : inner->inputs)
        if (in == from) in = to;
      rename_in_subgraphs(*inner, from, to);
    }
    for (auto& o : g.outputs)
      if (o.name == from) o.name = to;
  }
}
}  // namespace

// Renames a value wherever it is read (Note [Values are names]), in subgraphs too.
void Graph::replace_all_uses(const std::string& from, const std::string& to) {
  for (auto& n : impl_->nodes) {
    for (auto& in : n.inputs)
      if (in == from) in = to;
    rename_in_subgraphs(n, from, to);
  }
  for (auto& o : outputs)
    if (o.name == from) o.name = to;
}

std::string Graph::unique_name(const std::string& base) const {
  Impl& m = *impl_;
  if (!m.used_valid) {
    for (auto& n : m.nodes) m.index_names(n);
    m.used_valid = true;
  }
  auto taken = [&](const std::string& name) {
    return m.used.count(name) || initializers.count(name) || is_graph_input(name) || is_graph_output(name);
  };
  std::string name = base;
  if (taken(name)) {
    std::int64_t& k = m.next_suffix[base];
    do name = base + "_" + std::to_string(++k);
    while (taken(name));
  }
  m.used.insert(name);  // handed out: taken, even before the caller writes it anywhere
  return name;
}

void Graph::topological_sort() {
  // Kahn's algorithm that always takes the earliest ready node (a min-heap of positions), so an
  // already sorted graph keeps its order exactly; O(E log N).
  std::vector<std::list<Node>::iterator> at;
  for (auto it = impl_->nodes.begin(); it != impl_->nodes.end(); ++it) at.push_back(it);
  std::unordered_map<std::string, std::size_t> producer_of;
  for (std::size_t i = 0; i < at.size(); ++i)
    for (auto& o : at[i]->outputs)
      if (!o.empty()) producer_of[o] = i;
  std::vector<std::size_t> waiting(at.size(), 0);
  std::vector<std::vector<std::size_t>> readers(at.size());
  for (std::size_t i = 0; i < at.size(); ++i) {
    std::vector<std::string> reads = at[i]->inputs;
    for (auto& in : at[i]->implicit_inputs()) reads.push_back(in);  // Note [Subgraphs]
    for (auto& in : reads) {
      auto p = in.empty() ? producer_of.end() : producer_of.find(in);
      if (p == producer_of.end()) continue;  // graph inputs, initializers, unknown names
      ++waiting[i];
      readers[p->second].push_back(i);
    }
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < at.size(); ++i)
    if (waiting[i] == 0) ready.push(i);
  std::list<Node> sorted;
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    sorted.splice(sorted.end(), impl_->nodes, at[i]);
    for (std::size_t r : readers[i])
      if (--waiting[r] == 0) ready.push(r);
  }
  if (!impl_->nodes.empty()) {
    const std::string stuck = impl_->nodes.front().describe();
    sorted.splice(sorted.end(), impl_->nodes);
    impl_->nodes.swap(sorted);
    ++impl_->changes;
    throw Error("the graph has a cycle through " + stuck + "; ONNX graphs must be acyclic");
  }
  impl_->nodes.swap(sorted);
  ++impl_->changes;  // list nodes moved, iterators in `where` still point at them
}

std::size_t Graph::prune_dead() {
  // One pass from the back: in topological order every reader of a node's outputs comes after
  // it, so when a node is reached its outputs' read counts are final.
  std::unordered_map<std::string, std::size_t> reads;
  std::unordered_map<const Node*, std::vector<std::string>> implicit;  // Note [Subgraphs]
  for (auto& o : outputs) ++reads[o.name];
  for (auto& n : impl_->nodes) {
    for (auto& in : n.inputs)
      if (!in.empty()) ++reads[in];
    if (!n.subgraphs().empty())
      for (auto& in : implicit[&n] = n.implicit_inputs()) ++reads[in];
  }
  std::size_t removed = 0;
  for (auto it = impl_->nodes.end(); it != impl_->nodes.begin();) {
    --it;
    const bool used = std::any_of(it->outputs.begin(), it->outputs.end(), [&](const std::string& o) {
      auto r = o.empty() ? reads.end() : reads.find(o);
      return r != reads.end() && r->second > 0;
    });
    if (used) continue;
    for (auto& in : it->inputs)
      if (!in.empty()) --reads[in];
    if (auto im = implicit.find(&*it); im != implicit.end())
      for (auto& in : im->second) --reads[in];
    impl_->where.erase(&*it);
    it = impl_->nodes.erase(it);
    ++removed;
  }
  for (auto it = initializers.begin(); it != initializers.end();) {
    auto r = reads.find(it->first);
    if (r == reads.end() || r->second == 0) it = initializers.erase(it);
    else ++it;
  }
  if (removed) ++impl_->changes;
  return removed;
}

namespace {
// Validates `g` in a scope where `outer` (null for a main graph) is visible; `where` prefixes
// messages about a subgraph ("in 'then_branch' of node 'if1' (If): ").
void validate_scope(const Graph& g, const std::unordered_set<std::string>* outer, const std::string& where) {
  std::unordered_map<std::string, std::string> defined;  // name -> who defines it
  auto define = [&](const std::string& name, const std::string& who) {
    if (name.empty()) return;
    auto [it, fresh] = defined.emplace(name, who);
    if (!fresh && it->second != who)
      throw Error(where + "tensor '" + name + "' is defined twice: by " + it->second + " and by " + who);
  };
  for (auto& v : g.inputs) define(v.name, "graph input");
  for (auto& kv : g.initializers)
    if (!defined.count(kv.first)) define(kv.first, "initializer");
  const auto nodes = g.nodes();
  for (const Node* n : nodes)
    for (auto& o : n->outputs) define(o, n->describe());
  auto visible = [&](const std::string& name) { return defined.count(name) || (outer && outer->count(name)); };
  for (const Node* n : nodes) {
    for (auto& in : n->inputs)
      if (!in.empty() && !visible(in))
        throw Error(where + n->describe() + " reads tensor '" + in +
                    "' that no node, graph input or initializer produces");
    if (n->subgraphs().empty()) continue;
    std::unordered_set<std::string> scope = outer ? *outer : std::unordered_set<std::string>{};
    for (auto& kv : defined) scope.insert(kv.first);
    for (auto& kv : n->attributes)
      if (kv.second.kind == Attribute::Kind::kGraph && kv.second.graph)
        validate_scope(*kv.second.graph, &scope, where + "in '" + kv.first + "' of " + n->describe() + ": ");
  }
  for (auto& o : g.outputs)
    if (!visible(o.name)) throw Error(where + "graph output '" + o.name + "' is never produced");
}
}  // namespace

void Graph::validate() const { validate_scope(*this, nullptr, ""); }

std::vector<std::string> Graph::outer_reads() const {
  std::unordered_set<std::string> defined;
  for (auto& v : inputs) defined.insert(v.name);
  for (auto& kv : initializers) defined.insert(kv.first);
  for (auto& n : impl_->nodes)
    for (auto& o : n.outputs) defined.insert(o);
  std::set<std::string> out;
  auto read = [&](const std::string& name) {
    if (!name.empty() && !defined.count(name)) out.insert(name);
  };
  for (auto& n : impl_->nodes) {
    for (auto& in : n.inputs) read(in);
    for (auto& in : n.implicit_inputs()) read(in);
  }
  for (auto& o : outputs) read(o.name);  // a body output may pass an outer value through
  return {out.begin(), out.end()};
}

}  // namespace sparsebit
