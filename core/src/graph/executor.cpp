#include "sparsebit/core/executor.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <set>

#include "base/mapped_file.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/version.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

std::string dtype_name(const at::Tensor& t) {
  try {
    return onnx_type_name(onnx_type_of(t.scalar_type()));
  } catch (const Error&) {
    return c10::toString(t.scalar_type());
  }
}

bool is_control_flow(const Node& n) {
  return n.domain.empty() &&
         (n.op_type == "If" || n.op_type == "Loop" || n.op_type == "Scan" || n.op_type == "SequenceMap");
}

namespace {
// A Loop without a trip count runs while its condition holds; any Loop stops with an error past
// 2^24 iterations (SPARSEBIT_MAX_LOOP_ITERATIONS changes it), so a condition that never turns
// false is a message, not a hang.
constexpr std::int64_t kUnboundedLoop = std::numeric_limits<std::int64_t>::max();

std::int64_t max_loop_iterations() {
  static const std::int64_t limit = [] {
    const char* v = std::getenv("SPARSEBIT_MAX_LOOP_ITERATIONS");
    if (!v || !*v) return std::int64_t{1} << 24;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v, &end, 10);
    if (errno || *end || x < 1)
      throw Error("SPARSEBIT_MAX_LOOP_ITERATIONS='" + printable(v, 40) + "' is not a whole number of at least 1");
    return static_cast<std::int64_t>(x);
  }();
  return limit;
}

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

std::int64_t scalar_of(const at::Tensor& t, const Node& n, const char* what) {
  if (!t.defined() || t.numel() != 1) throw Error(n.describe() + ": " + what + " must hold exactly one value");
  return t.reshape({}).to(at::kCPU).to(at::kLong).item<std::int64_t>();
}
}  // namespace

struct Executor::ControlFlow {
  std::map<std::string, std::unique_ptr<Executor>> bodies;  ///< attribute name -> executor
  std::vector<std::string> implicit;                        ///< enclosing values the bodies read
  std::size_t first = 0, last = 0;                          ///< flat numbers of the nested nodes
};

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
      const std::vector<std::string> needed = n->op_type == "If"
                                                  ? std::vector<std::string>{"then_branch", "else_branch"}
                                                  : std::vector<std::string>{"body"};
      for (const auto& b : needed)
        if (!cf->bodies.count(b)) throw Error(n->describe() + ": the subgraph attribute '" + b + "' is missing");
      if (n->op_type == "If") check_branches_agree(*n);
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

std::map<std::string, at::Tensor> Executor::scope_of(std::size_t index,
                                                     const std::map<std::string, at::Tensor>& values) const {
  std::map<std::string, at::Tensor> scope;
  for (const auto& name : implicit_inputs(index)) {
    if (auto c = constants_.find(name); c != constants_.end()) scope[name] = c->second;
    else if (auto v = values.find(name); v != values.end()) scope[name] = v->second;
  }
  return scope;
}

std::vector<at::Tensor> Executor::run_control_flow(std::size_t index, const std::vector<at::Tensor>& inputs,
                                                   const std::map<std::string, at::Tensor>& scope,
                                                   const InputHook& hook) {
  const Node& n = graph_.node(index);
  ControlFlow& cf = *control_.at(index);
  for (const auto& name : cf.implicit)
    if (!scope.count(name)) throw Error(n.describe() + ": its subgraphs read '" + name + "', which was not given");
  auto input = [&](std::size_t i) { return i < inputs.size() ? inputs[i] : at::Tensor(); };
  auto check_outputs = [&](const std::vector<at::Tensor>& out, std::size_t want, const char* what) {
    if (out.size() != want)
      throw Error(n.describe() + ": its " + what + " gives " + std::to_string(out.size()) + " outputs, " +
                  std::to_string(want) + " expected");
  };
  if (n.op_type == "If") {
    const bool taken = scalar_of(input(0), n, "the condition") != 0;
    auto out = cf.bodies.at(taken ? "then_branch" : "else_branch")->run({}, hook, &scope);
    check_outputs(out, n.outputs.size(), taken ? "then_branch" : "else_branch");
    return out;
  }
  Executor& body = *cf.bodies.at("body");
  const Graph& bg = body.graph();
  std::vector<at::Tensor> result;
  if (n.op_type == "SequenceMap") {  // the body once per element of the sequences (Note [Sequence values])
    if (inputs.empty() || !input(0).defined() || !input(0).is_nested())
      throw Error(n.describe() + ": its first input must be a sequence");
    if (bg.inputs.size() != inputs.size())
      throw Error(n.describe() + ": its body takes " + std::to_string(bg.inputs.size()) + " inputs for " +
                  std::to_string(inputs.size()) + " node inputs");
    std::vector<std::vector<at::Tensor>> items(inputs.size());
    for (std::size_t j = 0; j < inputs.size(); ++j)
      if (inputs[j].defined() && inputs[j].is_nested()) items[j] = inputs[j].unbind();
    const std::size_t length = items[0].size();
    for (std::size_t j = 1; j < inputs.size(); ++j)
      if (!items[j].empty() && items[j].size() != length)
        throw Error(n.describe() + ": its sequences differ in length");
    std::vector<std::vector<at::Tensor>> outs(bg.outputs.size());
    for (std::size_t i = 0; i < length; ++i) {
      std::map<std::string, at::Tensor> feeds;
      for (std::size_t j = 0; j < inputs.size(); ++j)
        feeds[bg.inputs[j].name] = inputs[j].defined() && inputs[j].is_nested() ? items[j][i] : inputs[j];
      auto out = body.run(feeds, hook, &scope);
      for (std::size_t k = 0; k < out.size() && k < outs.size(); ++k) outs[k].push_back(out[k]);
    }
    for (std::size_t k = 0; k < outs.size(); ++k) {
      // An empty result keeps the element type the body declares (float when it declares none).
      const at::ScalarType dtype = !outs[k].empty()               ? outs[k][0].scalar_type()
                                   : bg.outputs[k].elem_type == 7 ? at::kLong
                                                                  : at::kFloat;
      result.push_back(sequence_of(outs[k], dtype));
    }
  } else if (n.op_type == "Loop") {
    const bool has_trips = input(0).defined(), has_cond = input(1).defined();
    if (!has_trips && !has_cond)
      throw Error(n.describe() + ": a Loop with neither a trip count nor a condition never ends");
    // ONNX's Loop runs a negative trip count zero times (a bound, not "unbounded").
    const std::int64_t trips =
        has_trips ? std::max<std::int64_t>(0, scalar_of(input(0), n, "the trip count M")) : kUnboundedLoop;
    const std::size_t carried_count = inputs.size() > 2 ? inputs.size() - 2 : 0;
    if (bg.inputs.size() != 2 + carried_count || bg.outputs.size() < 1 + carried_count)
      throw Error(n.describe() + ": its body takes " + std::to_string(bg.inputs.size()) + " inputs and gives " +
                  std::to_string(bg.outputs.size()) + " outputs for " + std::to_string(carried_count) +
                  " loop-carried values (expected 2 + N inputs, 1 + N + K outputs)");
    const std::size_t scan_count = bg.outputs.size() - 1 - carried_count;
    std::vector<at::Tensor> carried(inputs.begin() + 2, inputs.end());
    std::vector<std::vector<at::Tensor>> scans(scan_count);
    at::Tensor cond = has_cond ? input(1) : at::ones({}, at::kBool);
    bool going = scalar_of(cond, n, "the condition") != 0;
    for (std::int64_t i = 0; going && i < trips; ++i) {
      if (i == max_loop_iterations())
        throw Error(n.describe() + ": still running after " + std::to_string(max_loop_iterations()) +
                    " iterations (trip count " + (has_trips ? std::to_string(trips) : std::string("none")) +
                    ", condition still true); a calibration sample should not loop this long: check the data "
                    "that feeds the trip count and the condition, or allow more with "
                    "SPARSEBIT_MAX_LOOP_ITERATIONS");
      std::map<std::string, at::Tensor> feeds{{bg.inputs[0].name, at::full({}, i, at::kLong)},
                                              {bg.inputs[1].name, cond}};
      for (std::size_t j = 0; j < carried_count; ++j) feeds[bg.inputs[2 + j].name] = carried[j];
      auto out = body.run(feeds, hook, &scope);
      cond = out[0];
      going = scalar_of(cond, n, "the body's condition output") != 0;
      for (std::size_t j = 0; j < carried_count; ++j) carried[j] = out[1 + j];
      for (std::size_t k = 0; k < scan_count; ++k) scans[k].push_back(out[1 + carried_count + k]);
    }
    result = carried;
    for (auto& s : scans) result.push_back(s.empty() ? at::empty({0}) : at::stack(s, 0));
  } else {  // Scan; Scan-8 (opset < 9) puts a batch on axis 0 and runs each entry apart, along axis 1
    const bool batched = graph_.default_opset() < 9;
    if (batched && input(0).defined())
      throw Error(n.describe() +
                  ": Scan-8's sequence_lens (sequences of several lengths in one batch) is not "
                  "supported; re-export at opset 9 or newer");
    const std::vector<at::Tensor> operands(inputs.begin() + (batched ? 1 : 0), inputs.end());
    const std::int64_t m = n.attr_int("num_scan_inputs", 0);
    if (m < 1 || m > static_cast<std::int64_t>(operands.size()))
      throw Error(n.describe() + ": num_scan_inputs must lie in 1.." + std::to_string(operands.size()));
    const std::size_t states = operands.size() - static_cast<std::size_t>(m);
    if (bg.inputs.size() != operands.size() || bg.outputs.size() < states)
      throw Error(n.describe() + ": its body takes " + std::to_string(bg.inputs.size()) + " inputs for " +
                  std::to_string(operands.size()) + " node inputs");
    const std::size_t scan_out = bg.outputs.size() - states;
    auto per = [&](const char* key, std::size_t count) {
      auto v = n.attr_ints(key, std::vector<std::int64_t>(count, 0));
      if (v.size() != count)
        throw Error(n.describe() + ": " + key + " has " + std::to_string(v.size()) + " entries, " +
                    std::to_string(count) + " expected");
      return v;
    };
    const auto in_axes = per("scan_input_axes", static_cast<std::size_t>(m));
    const auto in_dirs = per(batched ? "directions" : "scan_input_directions", static_cast<std::size_t>(m));
    const auto out_axes = per("scan_output_axes", scan_out);
    const auto out_dirs = per("scan_output_directions", scan_out);
    auto scan = [&](const std::vector<at::Tensor>& xs) {  // one Scan-9 run
      std::vector<at::Tensor> seqs;
      std::vector<std::int64_t> axes;
      std::int64_t length = -1;
      for (std::size_t k = 0; k < static_cast<std::size_t>(m); ++k) {
        const at::Tensor& x = xs[states + k];
        std::int64_t axis = in_axes[k] < 0 ? in_axes[k] + x.dim() : in_axes[k];
        if (axis < 0 || axis >= x.dim()) throw Error(n.describe() + ": scan_input_axes is out of range");
        if (length >= 0 && x.size(axis) != length)
          throw Error(n.describe() + ": scan inputs differ in length along their scan axes");
        length = x.size(axis);
        seqs.push_back(x);
        axes.push_back(axis);
      }
      std::vector<at::Tensor> state(xs.begin(), xs.begin() + static_cast<long>(states));
      std::vector<std::vector<at::Tensor>> scans(scan_out);
      for (std::int64_t t = 0; t < length; ++t) {
        std::map<std::string, at::Tensor> feeds;
        for (std::size_t j = 0; j < states; ++j) feeds[bg.inputs[j].name] = state[j];
        for (std::size_t k = 0; k < seqs.size(); ++k)
          feeds[bg.inputs[states + k].name] = seqs[k].select(axes[k], in_dirs[k] ? length - 1 - t : t);
        auto out = body.run(feeds, hook, &scope);
        for (std::size_t j = 0; j < states; ++j) state[j] = out[j];
        for (std::size_t k = 0; k < scan_out; ++k) scans[k].push_back(out[states + k]);
      }
      std::vector<at::Tensor> outs = state;
      for (std::size_t k = 0; k < scan_out; ++k) {
        if (scans[k].empty()) {
          outs.push_back(at::empty({0}));
          continue;
        }
        if (out_dirs[k]) std::reverse(scans[k].begin(), scans[k].end());
        const std::int64_t rank = scans[k][0].dim() + 1;
        std::int64_t axis = out_axes[k] < 0 ? out_axes[k] + rank : out_axes[k];
        if (axis < 0 || axis >= rank) throw Error(n.describe() + ": scan_output_axes is out of range");
        outs.push_back(at::stack(scans[k], axis));
      }
      return outs;
    };
    if (!batched) {
      result = scan(operands);
    } else {
      const std::int64_t entries = operands[states].dim() > 0 ? operands[states].size(0) : 0;
      if (entries == 0) throw Error(n.describe() + ": Scan-8 needs a batch axis with at least one entry");
      std::vector<std::vector<at::Tensor>> per_entry(states + scan_out);
      for (std::int64_t b = 0; b < entries; ++b) {
        std::vector<at::Tensor> xs;
        for (const auto& x : operands) xs.push_back(x.select(0, b));
        auto outs = scan(xs);
        for (std::size_t k = 0; k < outs.size(); ++k) per_entry[k].push_back(outs[k]);
      }
      for (auto& p : per_entry) result.push_back(at::stack(p, 0));
    }
  }
  check_outputs(result, n.outputs.size(), "body");
  return result;
}

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
  } catch (const std::exception& e) {
    // ATen's errors carry a C++ backtrace that means nothing to users.
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    const std::string what = c10e ? c10e->what_without_backtrace() : e.what();
    std::string shapes;
    for (auto& t : inputs)
      shapes += (shapes.empty() ? "" : ", ") + (!t.defined()    ? std::string("none")
                                                : t.is_nested() ? std::string("a sequence")
                                                                : c10::str(t.sizes()));
    throw Error(n.describe() + " failed in plugin '" + bound.plugin + "' on inputs of shapes (" + shapes +
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
  return result;
}

}  // namespace sparsebit
