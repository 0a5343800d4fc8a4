#include "sparsebit/core/executor.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <set>

#include "sparsebit/core/onnx_io.h"
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

Executor::Executor(const Graph& graph, const Registry& registry) : graph_(graph) {
  constants_ = graph.initializers;
  std::vector<std::string> missing;
  std::set<std::string> missing_ops;
  for (const Node* n : graph.nodes()) {
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
  for (auto& kv : constants_) kv.second = kv.second.to(d);
}

std::map<std::string, int> Executor::use_counts() const {
  std::map<std::string, int> counts;
  for (const Node* n : graph_.nodes())
    for (const auto& in : n->inputs)
      if (!in.empty() && !constants_.count(in)) ++counts[in];
  return counts;
}

std::vector<at::Tensor> Executor::run_node(std::size_t index, const std::vector<at::Tensor>& inputs) {
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
      shapes += (shapes.empty() ? "" : ", ") + (t.defined() ? c10::str(t.sizes()) : std::string("none"));
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

std::vector<at::Tensor> Executor::run(const std::map<std::string, at::Tensor>& feeds, const InputHook& hook) {
  std::map<std::string, at::Tensor> live;
  for (const auto& in : graph_.inputs) {
    auto it = feeds.find(in.name);
    if (it == feeds.end()) throw Error("no value given for graph input '" + in.name + "'");
    live[in.name] = it->second;
  }
  auto counts = use_counts();
  std::set<std::string> outputs;
  for (const auto& o : graph_.outputs) outputs.insert(o.name);
  last_peak_live_ = live.size();

  const auto nodes = graph_.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    std::vector<at::Tensor> inputs(n.inputs.size());
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& name = n.inputs[k];
      if (name.empty()) continue;
      auto c = constants_.find(name);
      if (c != constants_.end()) {
        inputs[k] = c->second;
      } else {
        auto it = live.find(name);
        if (it == live.end()) throw Error(n.describe() + ": input '" + name + "' was not computed");
        inputs[k] = it->second;
      }
      if (hook) inputs[k] = hook(i, k, inputs[k]);
    }
    auto out = run_node(i, inputs);
    inputs.clear();
    for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
      if (!n.outputs[k].empty()) live[n.outputs[k]] = std::move(out[k]);
    last_peak_live_ = std::max(last_peak_live_, live.size());
    for (const auto& name : n.inputs) {
      auto it = counts.find(name);
      if (it == counts.end()) continue;
      if (--it->second == 0 && !outputs.count(name)) live.erase(name);
    }
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
    if (it == live.end()) throw Error("graph output '" + o.name + "' was not computed");
    result.push_back(it->second);
  }
  return result;
}

}  // namespace sparsebit
