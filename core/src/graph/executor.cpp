#include "sparsebit/core/executor.h"

#include "base/log.h"
#include "graph/control_flow.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <set>

#include "base/core_ops.h"
#include "base/mapped_file.h"
#include "graph/onnx_proto.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit {

std::string dtype_name(const at::Tensor& t) {
  try {
    return onnx_type_name(onnx_type_of(t.scalar_type()));
  } catch (const Error&) {
    return c10::toString(t.scalar_type());
  }
}

bool is_control_flow(const Node& n) {
  using namespace core_ops;
  return is(n, kIf) || is(n, kLoop) || is(n, kScan) || is(n, kSequenceMap);
}

namespace {
/// An If's branches must give outputs of the same element types (ONNX's If); a model where they
/// differ is refused at load, naming the node and the output, not run with whatever one gives.
void check_branches_agree(const Node& n) {
  const Graph* then_g = n.attributes.at("then_branch").graph.get();
  const Graph* else_g = n.attributes.at("else_branch").graph.get();
  if (then_g->outputs.size() != else_g->outputs.size())
    throw Error(n.describe() + ": then_branch gives " + std::to_string(then_g->outputs.size()) +
                " outputs and else_branch " + std::to_string(else_g->outputs.size()) + "; both must give the same");
  for (std::size_t k = 0; k < then_g->outputs.size(); ++k) {
    const int a = then_g->outputs[k].elem_type, b = else_g->outputs[k].elem_type;
    if (a != 0 && b != 0 && a != b)
      throw Error(n.describe() + ": output " + std::to_string(k) + " is " + onnx_type_name(a) + " in then_branch ('" +
                  then_g->outputs[k].name + "') and " + onnx_type_name(b) + " in else_branch ('" +
                  else_g->outputs[k].name + "'); ONNX's If needs the branches to agree");
  }
}

void append_flat(Graph& g, std::vector<FlatNode>& out) {
  const auto nodes = g.nodes();
  for (Node* n : nodes) out.push_back({n, &g});
  for (Node* n : nodes) {
    if (!is_control_flow(*n)) continue;
    for (auto& kv : n->attributes)  // name order, as Executor::number walks its bodies
      if (kv.second.kind == Attribute::Kind::kGraph && kv.second.graph) append_flat(*kv.second.graph, out);
  }
}
}  // namespace

std::vector<FlatNode> flat_nodes(Graph& g) {
  std::vector<FlatNode> out;
  append_flat(g, out);
  return out;
}

at::Tensor sequence_of(const std::vector<at::Tensor>& items, at::ScalarType dtype) {
  // Without ATen's one-time "prototype" warning about nested tensors: it says nothing to a user
  // of the model.
#if TORCH_VERSION_MAJOR >= 2
  struct Quiet final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  };
  static Quiet quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
#else
  struct Quiet final : c10::WarningHandler {
    void process(const c10::SourceLocation&, const std::string&, bool) override {}
  };
  static Quiet quiet;
  c10::Warning::WarningHandlerGuard guard(&quiet);
#endif
  return at::_nested_tensor_from_tensor_list(items, dtype);
}

namespace {
// The module of a control-flow node: quantizes nothing; the executor runs the node itself.
class ControlFlowModule final : public QModule {
 public:
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>&) override {
    throw Error("internal: control flow runs in the executor");
  }
};

}  // namespace

Executor::~Executor() = default;

Executor::Executor(const Graph& graph, const Registry& registry) : Executor(graph, registry, nullptr) { number(flat_); }

void Executor::number(std::vector<FlatEntry>& flat) {
  base_ = flat.size();
  for (std::size_t i = 0; i < modules_.size(); ++i) flat.push_back({this, i});
  for (auto& [index, cf] : control_) {
    cf->first = flat.size();
    for (auto& [name, body] : cf->bodies) body->number(flat);
    cf->last = flat.size();
  }
}

const Node& Executor::flat_node(std::size_t flat) const {
  const FlatEntry& e = flat_.at(flat);
  return e.owner->graph_.node(e.index);
}

const BoundModule& Executor::flat_module(std::size_t flat) const {
  const FlatEntry& e = flat_.at(flat);
  return e.owner->modules_[e.index];
}

std::vector<at::Tensor> Executor::run_flat_node(std::size_t flat, const std::vector<at::Tensor>& inputs) {
  const FlatEntry& e = flat_.at(flat);
  if (e.owner != this && e.owner->control_.count(e.index))
    throw Error(flat_node(flat).describe() + ": a nested control-flow node cannot run alone");
  return e.owner->run_node(e.index, inputs);
}

const at::Tensor* Executor::flat_constant(std::size_t flat, const std::string& name) const {
  for (const Executor* e = flat_.at(flat).owner; e; e = e->parent_)
    if (auto it = e->constants_.find(name); it != e->constants_.end()) return &it->second;
  return nullptr;
}

std::pair<std::size_t, std::size_t> Executor::nested_range(std::size_t index) const {
  auto it = control_.find(index);
  return it == control_.end() ? std::pair<std::size_t, std::size_t>{0, 0}
                              : std::pair<std::size_t, std::size_t>{it->second->first, it->second->last};
}

std::size_t Executor::enclosing_node(std::size_t flat) const {
  if (flat >= base_ && flat < base_ + modules_.size()) return flat - base_;
  for (const auto& [index, cf] : control_)
    if (flat >= cf->first && flat < cf->last) return index;
  throw Error("internal: node " + std::to_string(flat) + " is not nested in this graph");
}

Executor::Executor(const Graph& graph, const Registry& registry, const Executor* parent)
    : graph_(graph), parent_(parent) {
  constants_ = graph.initializers;
  std::vector<std::string> missing;
  std::set<std::string> missing_ops;
  const auto all = graph.nodes();
  for (std::size_t index = 0; index < all.size(); ++index) {
    const Node* n = all[index];
    if (is_control_flow(*n)) {
      auto cf = std::make_unique<ControlFlow>();
      for (const auto& kv : n->attributes)
        if (kv.second.kind == Attribute::Kind::kGraph && kv.second.graph)
          cf->bodies[kv.first] = std::unique_ptr<Executor>(new Executor(*kv.second.graph, registry, this));
      const std::vector<std::string> needed = n->op_type == core_ops::kIf
                                                  ? std::vector<std::string>{"then_branch", "else_branch"}
                                                  : std::vector<std::string>{"body"};
      for (const auto& b : needed)
        if (!cf->bodies.count(b)) throw Error(n->describe() + ": the subgraph attribute '" + b + "' is missing");
      if (n->op_type == core_ops::kIf) check_branches_agree(*n);
      cf->implicit = n->implicit_inputs();
      control_[index] = std::move(cf);
      modules_.push_back({std::make_unique<ControlFlowModule>(), "core (control flow)"});
      continue;
    }
    const auto* entry = registry.op(n->op_type, n->domain);
    if (!entry) {
      std::string op = (n->domain.empty() ? "" : n->domain + ":") + n->op_type;
      missing_ops.insert(op);
      if (missing.size() < 5) missing.push_back(n->describe());
      modules_.push_back({});
      continue;
    }
    auto it = graph.opset_imports.find(n->domain);
    OpContext ctx{*n, it == graph.opset_imports.end() ? 0 : it->second, graph};
    BoundModule bound;
    bound.plugin = entry->plugin;
    try {
      bound.module = entry->factory(ctx);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " [plugin '" + entry->plugin + "']");
    } catch (const std::exception& e) {
      throw Error(n->describe() + ": plugin '" + entry->plugin + "' failed to create its QModule: " + e.what());
    }
    if (!bound.module) throw Error(n->describe() + ": plugin '" + entry->plugin + "' returned no QModule");
    modules_.push_back(std::move(bound));
  }
  if (!missing_ops.empty()) {
    std::string ops;
    for (auto& o : missing_ops) ops += (ops.empty() ? "" : ", ") + o;
    std::string nodes;
    for (auto& m : missing) nodes += (nodes.empty() ? "" : ", ") + m;
    throw Error("no QModule for op" + std::string(missing_ops.size() > 1 ? "s " : " ") + ops + " (used by " + nodes +
                (missing.size() < 5 ? "" : ", ...") +
                "). Run `sparsebit plugins` to see which ops the loaded plugins provide, or add a plugin "
                "that registers them");
  }
}

void Executor::set_constant(const std::string& name, at::Tensor value) {
  auto it = constants_.find(name);
  if (it == constants_.end()) throw Error("set_constant: '" + name + "' is not a constant of the graph");
  it->second = std::move(value);
  host_constants_.erase(name);
}

void Executor::add_constant(const std::string& name, at::Tensor value) {
  if (!constants_.emplace(name, std::move(value)).second) throw Error("add_constant: '" + name + "' already exists");
}

void Executor::to(const std::string& device) {
  at::Device d(device);
  // Full FP32 on the GPU: TensorFloat-32 convolutions and matrix products (on by default for
  // cuDNN) round inputs to 10 mantissa bits and would move calibrated ranges by ~1e-3.
  if (d.is_cuda()) {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  // Note [Host copies of shape constants]
  // Ops read shapes, axes, pads and counts on the host. A small constant moved to a GPU
  // would be copied back and waited for at every run (a stall per Reshape, Pad or Slice, and a
  // training step that cannot be recorded as a CUDA graph), so its host copy is kept too and
  // given to the inputs whose op declares InputSpec::host; other readers get the device copy.
  // Small: integer lists up to 4,096 values (shapes, index lists; not tables), other types up to
  // 16 (Resize's scales, Clip's bounds, Pad's value).
  host_constants_.clear();
  for (auto& kv : constants_) {
    const at::Tensor& t = kv.second;
    const bool integral = !t.is_floating_point() && !t.is_complex();
    if (!d.is_cpu() && t.device().is_cpu() && !t.is_nested() && t.numel() <= (integral ? 4096 : 16))
      host_constants_[kv.first] = t.clone();
    at::Tensor moved = kv.second.to(d);
    if (!moved.is_same(kv.second)) page_out(kv.second);  // Note [Mapped weights]: the device holds it now
    kv.second = std::move(moved);
  }
  for (auto& [index, cf] : control_)
    for (auto& [name, body] : cf->bodies) body->to(device);
}

std::map<std::string, int> Executor::use_counts() const {
  std::map<std::string, int> counts;
  for (const Node* n : graph_.nodes())
    for (const auto& in : n->inputs)
      if (!in.empty() && !constants_.count(in)) ++counts[in];
  for (const auto& [index, cf] : control_)
    for (const auto& in : cf->implicit)
      if (!constants_.count(in)) ++counts[in];
  return counts;
}

const std::vector<std::string>& Executor::implicit_inputs(std::size_t index) const {
  static const std::vector<std::string> none;
  auto it = control_.find(index);
  return it == control_.end() ? none : it->second->implicit;
}

namespace {
std::string shapes_of(const std::vector<at::Tensor>& inputs) {
  std::string shapes;
  for (auto& t : inputs)
    shapes += (shapes.empty() ? "" : ", ") + (!t.defined()    ? std::string("none")
                                              : t.is_nested() ? std::string("a sequence")
                                                              : c10::str(t.sizes()));
  return shapes;
}
}  // namespace

std::vector<at::Tensor> Executor::run_node(std::size_t index, const std::vector<at::Tensor>& inputs,
                                           const std::map<std::string, at::Tensor>& scope, const InputHook& hook) {
  if (control_.count(index)) return run_control_flow(index, inputs, scope, hook);
  const Node& n = graph_.node(index);
  BoundModule& bound = modules_[index];
  std::vector<at::Tensor> out;
  try {
    out = bound.module->forward(inputs);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " [plugin '" + bound.plugin + "']");
  } catch (const MemoryLimitExceeded& e) {
    // Note [Memory limit]: the sizes come from the inputs' values or the node's attributes.
    throw Error(n.describe() + " on inputs of shapes (" + shapes_of(inputs) + ") needs a tensor of " +
                memory_size_text(e.requested()) + "; with " + memory_size_text(e.in_use()) +
                " in use that passes the memory limit of " + memory_size_text(e.limit()) +
                " (--memory-limit; by default 90% of this machine's memory). Check the values that set its "
                "output's size (a shape input, repeats, pads, scales, a batch size); if the machine has the "
                "memory, raise the limit");
  } catch (const std::exception& e) {
    // ATen's errors carry a C++ backtrace that means nothing to users.
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    const std::string what = c10e ? c10e->what_without_backtrace() : e.what();
    throw Error(n.describe() + " failed in plugin '" + bound.plugin + "' on inputs of shapes (" + shapes_of(inputs) +
                "): " + what);
  }
  if (out.size() < n.outputs.size()) {
    // Trailing optional outputs may be omitted by the node; only named ones must exist.
    for (std::size_t i = out.size(); i < n.outputs.size(); ++i)
      if (!n.outputs[i].empty())
        throw Error(n.describe() + ": plugin '" + bound.plugin + "' produced " + std::to_string(out.size()) +
                    " outputs, the node uses " + std::to_string(n.outputs.size()));
  }
  return out;
}

bool Executor::reads_on_host(std::size_t index, std::size_t input) const {
  const auto& module = modules_[index].module;
  if (!module) return false;
  const auto specs = module->input_specs();
  return input < specs.size() && specs[input].host;
}

// Note [Declared outputs]
// A model's declaration of an output is what its export declares too, and what a runtime checks
// the graph against when it loads the file: an element type, tensor-or-sequence or rank that the
// graph does not compute makes the export a file ONNX Runtime refuses, so the first run refuses
// it, naming the output, the declaration and what the graph computes. A fixed dimension that
// differs (an exporter that fixed the batch of an output but not of its input) is what ONNX
// Runtime itself only warns about at run time: a warning here, and the export keeps it.
namespace {
std::string declared_text(const ValueInfo& v) {
  return onnx_type_name(v.elem_type) + (v.has_shape ? " " + shape_text(v.shape) : "");
}

void check_declared_outputs(const std::vector<ValueInfo>& declared, const std::vector<at::Tensor>& computed) {
  for (std::size_t i = 0; i < declared.size() && i < computed.size(); ++i) {
    const ValueInfo& v = declared[i];
    const at::Tensor& t = computed[i];
    if (!t.defined() || v.elem_type == 0) continue;  // undeclared, or a sequence or optional declared
    const std::string name = "graph output '" + printable(v.name, 80) + "'";
    const std::string fix =
        "; correct the declaration (ONNX's shape inference writes what the graph computes) or "
        "re-export the model";
    if (t.is_nested())
      throw Error(name + " is declared a tensor (" + declared_text(v) + ") but the graph computes a sequence" + fix);
    const std::string got = dtype_name(t) + " " + c10::str(t.sizes());
    // Types LibTorch has no dtype for (uint16, int4, float8) are held in a wider one.
    std::int32_t type = 0;
    try {
      type = onnx_type_of(t.scalar_type());
    } catch (const Error&) {
    }
    if (type != 0 && !proto::is_narrow_type(v.elem_type) && type != v.elem_type)
      throw Error(name + " is declared " + declared_text(v) + ", the graph computes " + got + fix);
    if (!v.has_shape) continue;
    if (static_cast<std::int64_t>(v.shape.size()) != t.dim())
      throw Error(name + " is declared " + declared_text(v) + ", the graph computes " + got + fix);
    for (std::size_t d = 0; d < v.shape.size(); ++d)
      if (v.shape[d].value >= 0 && v.shape[d].value != t.size(static_cast<std::int64_t>(d))) {
        logs::warn("{}", name + " is declared " + declared_text(v) + ", the graph computes " + got +
                             " for this data; the export keeps the declaration (ONNX Runtime warns of it at run time)");
        break;
      }
  }
}
}  // namespace

std::vector<at::Tensor> Executor::run(const std::map<std::string, at::Tensor>& feeds, const InputHook& hook,
                                      const std::map<std::string, at::Tensor>* outer) {
  std::map<std::string, at::Tensor> live;
  for (const auto& in : graph_.inputs) {
    auto it = feeds.find(in.name);
    if (it == feeds.end()) throw Error("no value given for graph input '" + in.name + "'");
    live[in.name] = it->second;
  }
  // A value from the graph's constants, the values computed so far, or enclosing scopes.
  auto lookup = [&](const std::string& name, const Node& reader) -> at::Tensor {
    if (auto c = constants_.find(name); c != constants_.end()) return c->second;
    if (auto it = live.find(name); it != live.end()) return it->second;
    if (outer)
      if (auto it = outer->find(name); it != outer->end()) return it->second;
    throw Error(reader.describe() + ": input '" + name + "' was not computed");
  };
  auto counts = use_counts();
  std::set<std::string> outputs;
  for (const auto& o : graph_.outputs) outputs.insert(o.name);
  last_peak_live_ = live.size();

  using Clock = std::chrono::steady_clock;
  const auto nodes = graph_.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    const auto t0 = op_timing_ ? Clock::now() : Clock::time_point{};
    std::vector<at::Tensor> inputs(n.inputs.size());
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& name = n.inputs[k];
      if (name.empty()) continue;
      inputs[k] = lookup(name, n);
      if (auto h = host_constants_.find(name); h != host_constants_.end() && reads_on_host(i, k)) inputs[k] = h->second;
      if (hook) inputs[k] = hook(base_ + i, k, inputs[k]);
    }
    std::map<std::string, at::Tensor> scope;  // what a control-flow node's bodies read
    if (auto cf = control_.find(i); cf != control_.end())
      for (const auto& name : cf->second->implicit) scope[name] = lookup(name, n);
    const auto t1 = op_timing_ ? Clock::now() : Clock::time_point{};
    auto out = run_node(i, inputs, scope, hook);
    if (op_timing_) {  // Note [Op timing]
      OpTime& t = op_times_[n.op_type];
      t.hook_seconds += std::chrono::duration<double>(t1 - t0).count();
      t.seconds += std::chrono::duration<double>(Clock::now() - t1).count();
      ++t.calls;
    }
    inputs.clear();
    scope.clear();
    for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
      if (!n.outputs[k].empty()) live[n.outputs[k]] = std::move(out[k]);
    last_peak_live_ = std::max(last_peak_live_, live.size());
    auto release = [&](const std::string& name) {
      auto it = counts.find(name);
      if (it == counts.end()) return;
      if (--it->second == 0 && !outputs.count(name)) live.erase(name);
    };
    for (const auto& name : n.inputs) release(name);
    if (auto cf = control_.find(i); cf != control_.end())
      for (const auto& name : cf->second->implicit) release(name);
    // Outputs nobody reads (and that are not graph outputs) are released at once.
    for (const auto& name : n.outputs)
      if (!name.empty() && !counts.count(name) && !outputs.count(name)) live.erase(name);
  }
  std::vector<at::Tensor> result;
  for (const auto& o : graph_.outputs) {
    auto c = constants_.find(o.name);
    if (c != constants_.end()) {
      result.push_back(c->second);
      continue;
    }
    auto it = live.find(o.name);
    if (it != live.end()) {
      // Ops may compute in another memory layout (Note [Channels-last convolutions]); callers
      // get the standard one.
      result.push_back(it->second.contiguous());
      continue;
    }
    if (outer)  // a subgraph output that passes an enclosing value through
      if (auto e = outer->find(o.name); e != outer->end()) {
        result.push_back(e->second);
        continue;
      }
    throw Error("graph output '" + o.name + "' was not computed");
  }
  if (!outer && !outputs_checked_) {
    check_declared_outputs(graph_.outputs, result);
    outputs_checked_ = true;
  }
  return result;
}

}  // namespace sparsebit
