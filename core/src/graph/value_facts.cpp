// Value facts for opset lifting (Note [Opset lifting] in opset_lift.h): what rank and element
// type each value has, from the declarations and ONNX's shape inference, or observed on a sample.
#include "graph/value_facts.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <map>

#include "base/log.h"
#include "graph/onnx_proto.h"
#include "graph/run_isolated.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {
namespace {

// -- static facts -------------------------------------------------------------------------------

ValueFact fact_of(const ValueInfo& v) {
  ValueFact f;
  f.elem_type = v.elem_type;
  if (v.has_shape) {
    f.rank = static_cast<std::int64_t>(v.shape.size());
    for (const auto& d : v.shape) f.dims.push_back(d.value >= 0 ? d.value : -1);
  }
  return f;
}

ValueFact fact_of(const at::Tensor& t) {
  ValueFact f;
  if (!t.defined() || t.is_nested()) return f;  // an empty optional, a sequence: no tensor facts
  f.rank = t.dim();
  f.dims = t.sizes().vec();
  try {
    f.elem_type = onnx_type_of(t.scalar_type());
  } catch (const Error&) {
  }
  return f;
}

/// Adds what ONNX inferred for the values of `g` and of its bodies, where nothing is known yet.
void collect(const onnx::GraphProto& g, ValueFacts& f) {
  for (const auto* list : {&g.value_info(), &g.output(), &g.input()})
    for (const auto& v : *list)
      if (v.type().has_tensor_type() && !f.count(v.name())) f[v.name()] = fact_of(proto::value_info_from_proto(v));
  for (const auto& n : g.node())
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect(a.g(), f);
      for (const auto& sub : a.graphs()) collect(sub, f);
    }
}

// Ranks, element types and dims of the values the graph does not declare come from ONNX's
// shape inference, run on the graph's structure (weights travel as typed inputs, without their
// data) in a child process (run_isolated.h). What it cannot infer stays unknown, and the rules
// that need it refuse or take the general form.
void add_inferred(const Graph& graph, ValueFacts& f) {
  int status = 0;
  const std::string result = run_isolated(
      proto::structure_of(graph, /*inline_elements=*/4096),
      [](onnx::ModelProto& m) {
        onnx::shape_inference::InferShapes(m);
        return m;
      },
      status);
  onnx::ModelProto inferred;
  if (result.empty() || result[0] != '1' ||
      !inferred.ParseFromArray(result.data() + 1, static_cast<int>(result.size() - 1))) {
    logs::debug("{}", "ONNX's shape inference did not run on the graph (" +
                          (result.size() > 1 ? result.substr(1) : std::string("it crashed")) +
                          "); only declared ranks and types are known");
    return;
  }
  collect(inferred.graph(), f);
}

}  // namespace

ValueFacts static_value_facts(const Graph& graph, const std::vector<ValueInfo>& declared) {
  ValueFacts f;
  for (const auto& v : graph.inputs) f[v.name] = fact_of(v);
  for (const auto& v : declared) f[v.name] = fact_of(v);
  for (const auto& v : graph.outputs)
    if (!f.count(v.name)) f[v.name] = fact_of(v);
  for (const auto& [name, t] : graph.initializers) f[name] = fact_of(t);
  add_inferred(graph, f);
  return f;
}

namespace detail {
std::vector<at::Tensor> run_sample(const Graph& graph, const Registry& registry, const std::vector<at::Tensor>& sample,
                                   ValueFacts* facts) {
  if (sample.size() != graph.inputs.size())
    throw Error("the sample has " + std::to_string(sample.size()) + " tensors for " +
                std::to_string(graph.inputs.size()) + " graph inputs");
  Executor ex(graph, registry);
  std::map<std::string, at::Tensor> feeds;
  for (std::size_t i = 0; i < sample.size(); ++i) feeds[graph.inputs[i].name] = sample[i];
  c10::InferenceMode guard;
  Executor::InputHook hook;
  if (facts) {
    hook = [&](std::size_t node, std::size_t input, const at::Tensor& v) {
      const std::string& name = ex.flat_node(node).inputs[input];
      if (!facts->count(name)) (*facts)[name] = fact_of(v);
      return v;
    };
  }
  auto outputs = ex.run(feeds, hook);
  if (facts)
    for (std::size_t i = 0; i < outputs.size() && i < graph.outputs.size(); ++i)
      if (outputs[i].defined()) (*facts)[graph.outputs[i].name] = fact_of(outputs[i]);
  return outputs;
}
}  // namespace detail

ValueFacts observed_value_facts(const Graph& graph, const Registry& registry, const std::vector<at::Tensor>& sample) {
  ValueFacts f;
  detail::run_sample(graph, registry, sample, &f);
  return f;
}

}  // namespace sparsebit
