// Value facts for opset lifting (Note [Opset lifting] in opset_lift.h): what rank and element
// type each value has, propagated statically from declared shapes or observed on a sample.
#include "graph/value_facts.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <map>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace {

using detail::kBool;
using detail::kFloat;
using detail::kInt64;

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

/// Ops whose output 0 has the rank and element type of input 0.
// A table of op names, packed (not one per line):
// clang-format off
const std::set<std::string> kLikeInput = {
    "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign",
    "Mish", "Gelu", "PRelu", "ThresholdedRelu", "Softmax", "LogSoftmax", "Hardmax", "Clip", "BatchNormalization",
    "InstanceNormalization", "LayerNormalization", "GroupNormalization", "LRN", "Dropout", "Identity", "Conv",
    "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "Pad", "Resize",
    "Upsample", "Transpose", "Slice", "Split", "Tile", "CumSum", "DepthToSpace", "SpaceToDepth", "Sqrt", "Exp", "Log",
    "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
    "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Trilu", "ScatterElements", "Scatter", "ScatterND", "TopK",
    "LpNormalization", "MeanVarianceNormalization", "Shrink"};
// clang-format on
/// Element-wise with broadcasting: rank is the largest input rank.
const std::set<std::string> kBroadcast = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean"};
const std::set<std::string> kCompare = {"Equal",       "Greater", "Less", "GreaterOrEqual",
                                        "LessOrEqual", "And",     "Or",   "Xor"};

/// Integer values of an initializer input or an ints attribute (nullopt when neither).
std::optional<std::vector<std::int64_t>> ints_of(const Graph& g, const Node& n, const char* attr, std::size_t input) {
  if (n.has_attr(attr)) return n.attr_ints(attr);
  if (n.has_input(input)) {
    auto it = g.initializers.find(n.inputs[input]);
    if (it == g.initializers.end()) return std::nullopt;
    at::Tensor t = it->second.to(at::kLong).contiguous().reshape({-1});
    return std::vector<std::int64_t>(t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel());
  }
  return std::nullopt;
}

void propagate(const Graph& g, const Node& n, ValueFacts& f) {
  if (!n.domain.empty() || n.outputs.empty()) return;
  auto in = [&](std::size_t i) -> ValueFact {
    if (!n.has_input(i)) return {};
    auto it = f.find(n.inputs[i]);
    return it == f.end() ? ValueFact{} : it->second;
  };
  auto set = [&](std::size_t k, std::int64_t rank, std::int32_t type) {
    if (k >= n.outputs.size() || n.outputs[k].empty() || f.count(n.outputs[k])) return;
    ValueFact v;
    v.rank = rank;
    v.elem_type = type;
    f[n.outputs[k]] = v;
  };
  const ValueFact x = in(0);
  const std::string& op = n.op_type;
  if (kLikeInput.count(op)) {
    for (std::size_t k = 0; k < n.outputs.size(); ++k) set(k, x.rank, x.elem_type);
    if (op == "TopK" && n.outputs.size() > 1) f[n.outputs[1]].elem_type = kInt64;
  } else if (kBroadcast.count(op) || kCompare.count(op)) {
    std::int64_t rank = -1;
    bool known = true;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const auto r = in(i).rank;
      if (r < 0) known = false;
      rank = std::max(rank, r);
    }
    set(0, known ? rank : -1, kCompare.count(op) ? kBool : x.elem_type);
  } else if (op == "Not" || op == "IsNaN" || op == "IsInf") {
    set(0, x.rank, kBool);
  } else if (op == "Cast") {
    set(0, x.rank, static_cast<std::int32_t>(n.attr_int("to", 0)));
  } else if (op == "CastLike") {
    set(0, x.rank, in(1).elem_type);
  } else if (op == "Where") {
    std::int64_t rank = -1;
    bool known = true;
    for (std::size_t i = 0; i < 3; ++i) {
      if (in(i).rank < 0) known = false;
      rank = std::max(rank, in(i).rank);
    }
    set(0, known ? rank : -1, in(1).elem_type);
  } else if (op == "Shape") {
    set(0, 1, kInt64);
  } else if (op == "Size") {
    set(0, 0, kInt64);
  } else if (op == "NonZero") {
    set(0, 2, kInt64);
  } else if (op == "Flatten" || op == "Gemm") {
    set(0, 2, x.elem_type);
  } else if (op == "MatMul") {
    const auto a = x.rank, b = in(1).rank;
    set(0, a >= 2 && b >= 2 ? std::max(a, b) : -1, x.elem_type);
  } else if (op == "Reshape") {
    auto shape = ints_of(g, n, "shape", 1);
    set(0, shape ? static_cast<std::int64_t>(shape->size()) : -1, x.elem_type);
  } else if (op == "Unsqueeze" || op == "Squeeze") {
    auto axes = ints_of(g, n, "axes", 1);
    const auto delta = axes ? static_cast<std::int64_t>(axes->size()) : -1;
    set(0, x.rank >= 0 && delta >= 0 ? x.rank + (op == "Unsqueeze" ? delta : -delta) : -1, x.elem_type);
  } else if (op == "Concat") {
    std::int64_t rank = -1;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) rank = std::max(rank, in(i).rank);
    set(0, rank, x.elem_type);
  } else if (op == "Gather") {
    const auto r = in(1).rank;
    set(0, x.rank >= 0 && r >= 0 ? x.rank + r - 1 : -1, x.elem_type);
  } else if (op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin") {
    const bool arg = op == "ArgMax" || op == "ArgMin";
    std::int64_t rank = -1;
    if (n.attr_int("keepdims", 1)) {
      rank = x.rank;
    } else if (arg) {
      rank = x.rank >= 0 ? x.rank - 1 : -1;
    } else if (auto axes = ints_of(g, n, "axes", 1)) {
      rank = x.rank >= 0 ? x.rank - static_cast<std::int64_t>(axes->size()) : -1;
    } else if (!n.has_input(1)) {
      rank = 0;
    }
    set(0, rank, arg ? kInt64 : x.elem_type);
  } else if (op == "Expand") {
    auto shape = ints_of(g, n, "shape", 1);
    set(0, shape && x.rank >= 0 ? std::max<std::int64_t>(x.rank, static_cast<std::int64_t>(shape->size())) : -1,
        x.elem_type);
  } else if (op == "Range") {
    set(0, 1, x.elem_type);
  } else if (op == "DequantizeLinear") {
    set(0, x.rank, in(1).elem_type ? in(1).elem_type : kFloat);
  } else if (op == "QuantizeLinear") {
    set(0, x.rank, in(2).elem_type ? in(2).elem_type : 2);
  }
}

}  // namespace

ValueFacts static_value_facts(const Graph& graph, const std::vector<ValueInfo>& declared) {
  ValueFacts f;
  for (const auto& v : graph.inputs) f[v.name] = fact_of(v);
  for (const auto& v : declared) f[v.name] = fact_of(v);
  for (const auto& v : graph.outputs)
    if (!f.count(v.name)) f[v.name] = fact_of(v);
  for (const auto& [name, t] : graph.initializers) f[name] = fact_of(t);
  for (const Node* n : graph.nodes()) propagate(graph, *n, f);
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
