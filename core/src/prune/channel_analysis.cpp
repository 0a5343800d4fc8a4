// Channel analysis (Note [Channel removal]): channels become atoms, ops that mix channels
// unite or pin them, and every constant that reads a channel axis is recorded as a site.

#include "prune/channel_analysis.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <set>

#include "sparsebit/sdk/error.h"

namespace sparsebit::prune_detail {
namespace {

/// The value of a constant tensor: an initializer or a Constant node's `value`.
std::optional<at::Tensor> constant_value(const Graph& g, const std::string& name) {
  if (auto it = g.initializers.find(name); it != g.initializers.end()) return it->second;
  for (const Node* n : g.nodes())
    if (n->op_type == "Constant" && !n->outputs.empty() && n->outputs[0] == name && n->has_attr("value"))
      return n->attr_tensor("value");
  return std::nullopt;
}

std::vector<std::int64_t> int_values(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous().flatten();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

const std::set<std::string> kUnary = {
    "Relu",     "LeakyRelu", "Sigmoid", "Tanh",  "HardSigmoid", "HardSwish", "Elu",  "Selu", "Celu", "Softplus",
    "Softsign", "Gelu",      "Mish",    "Erf",   "Exp",         "Log",       "Abs",  "Neg",  "Sqrt", "Reciprocal",
    "Floor",    "Ceil",      "Round",   "Sign",  "Identity",    "Dropout",   "Cast", "Sin",  "Cos",  "ThresholdedRelu",
    "Clip",     "Not",       "IsNaN",   "IsInf", "Shrink"};
const std::set<std::string> kBroadcast = {
    "Add",  "Sub",   "Mul",   "Div",   "Pow",     "Max",     "Min",         "Sum",
    "Mean", "PRelu", "Where", "Equal", "Less",    "Greater", "LessOrEqual", "GreaterOrEqual",
    "And",  "Or",    "Xor",   "Mod",   "BitShift"};
const std::set<std::string> kPool = {"MaxPool",       "AveragePool", "GlobalAveragePool",
                                     "GlobalMaxPool", "LpPool",      "GlobalLpPool"};
const std::set<std::string> kReduce = {"ReduceMean", "ReduceSum", "ReduceMax",    "ReduceMin",       "ReduceProd",
                                       "ReduceL1",   "ReduceL2",  "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

}  // namespace

void ChannelAnalysis::run(const std::function<std::pair<bool, double>(const Node&)>& prunable) {
  const auto nodes = g_.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    current_ = nodes[i];
    visit(i, *nodes[i], prunable);
  }
  current_ = nullptr;
  for (const auto& o : g_.outputs)
    if (auto* t = tracked(o.name)) pin(*t);
}

Track* ChannelAnalysis::tracked(const std::string& v) {
  auto it = tracks_.find(v);
  return it == tracks_.end() ? nullptr : &it->second;
}

const Shape* ChannelAnalysis::shape(const std::string& v) const {
  auto it = shapes_.find(v);
  return it == shapes_.end() ? nullptr : &it->second;
}

const at::Tensor* ChannelAnalysis::initializer(const std::string& v) const {
  auto it = g_.initializers.find(v);
  return it == g_.initializers.end() ? nullptr : &it->second;
}

void ChannelAnalysis::pin(const Track& t) {
  for (int a : t.atoms) {
    if (!pinned[a]) reason[a] = current_ ? current_->describe() : "a graph output";
    pinned[a] = true;
  }
}

void ChannelAnalysis::pin_inputs(const Node& n) {
  for (const auto& in : n.inputs)
    if (auto* t = tracked(in)) pin(*t);
}

int ChannelAnalysis::new_atom(int producer, std::int64_t channel, bool pin_it) {
  const int a = uf.make();
  pinned.push_back(pin_it);
  if (pin_it)
    reason[a] = current_ && producer >= 0 ? current_->describe() + " ([sparse] skip or ratio 0)"
                : current_                ? current_->describe()
                                          : std::string("?");
  atom_producer.push_back(producer);
  atom_channel.push_back(channel);
  return a;
}

void ChannelAnalysis::set_output(const Node& n, std::size_t k, Track t) {
  if (k < n.outputs.size() && !n.outputs[k].empty()) tracks_[n.outputs[k]] = std::move(t);
}

std::int64_t ChannelAnalysis::attr_axis(const Node& n, const char* key, std::int64_t fallback,
                                        std::int64_t rank) const {
  std::int64_t a = n.attr_int(key, fallback);
  return a < 0 ? a + rank : a;
}

std::optional<std::vector<std::int64_t>> ChannelAnalysis::axes_of(const Node& n, const char* key, std::size_t input,
                                                                  std::int64_t rank) const {
  std::vector<std::int64_t> axes;
  if (n.has_attr(key)) axes = n.attr_ints(key);
  else if (n.has_input(input)) {
    auto c = constant_value(g_, n.inputs[input]);
    if (!c) return std::nullopt;
    axes = int_values(*c);
  }
  for (auto& a : axes) a = a < 0 ? a + rank : a;
  return axes;
}

void ChannelAnalysis::visit(std::size_t i, const Node& n,
                            const std::function<std::pair<bool, double>(const Node&)>& prunable) {
  const std::string& op = n.op_type;
  Track* x = n.inputs.empty() ? nullptr : tracked(n.inputs[0]);
  const Shape* xs = n.inputs.empty() ? nullptr : shape(n.inputs[0]);
  const bool onnx = n.domain.empty() || n.domain == "ai.onnx";
  if (!onnx) return pin_inputs(n);

  if (op == "Conv" || op == "ConvTranspose") {
    const at::Tensor* w = n.inputs.size() > 1 ? initializer(n.inputs[1]) : nullptr;
    const std::int64_t group = n.attr_int("group", 1);
    const bool transpose = op == "ConvTranspose";
    if (!w || w->dim() < 3) return pin_inputs(n);
    const std::int64_t in_axis = transpose ? 0 : 1, out_axis = transpose ? 1 : 0;
    if (x) {
      if (x->axis != 1) return pin_inputs(n);
      const bool depthwise = !transpose && group > 1 && group == static_cast<std::int64_t>(x->atoms.size()) &&
                             w->size(0) == group && w->size(1) == 1;
      if (depthwise) {
        if (!param(i, n, 1, 0, x->atoms) || !param(i, n, 2, 0, x->atoms)) return pin_inputs(n);
        counts.push_back({i, -1, 0, x->atoms});
        return set_output(n, 0, *x);
      }
      if (group != 1 || !param(i, n, 1, in_axis, x->atoms, Site::kConsumer)) pin(*x);
    }
    if (group != 1) return;
    Track out{1, {}};
    new_producer(i, n, w->size(out_axis), out, prunable);
    if (!param(i, n, 1, out_axis, out.atoms, Site::kProducer) || !param(i, n, 2, 0, out.atoms, Site::kProducer))
      pin(out);
    return set_output(n, 0, out);
  }
  if (op == "Gemm" || op == "MatMul") {
    const at::Tensor* w = n.inputs.size() > 1 ? initializer(n.inputs[1]) : nullptr;
    const bool gemm = op == "Gemm";
    const bool trans_b = gemm && n.attr_int("transB", 0) != 0;
    if (!w || w->dim() != 2 || (gemm && n.attr_int("transA", 0) != 0) || !xs || xs->size() < (gemm ? 2u : 1u))
      return pin_inputs(n);
    const std::int64_t in_axis = trans_b ? 1 : 0, out_axis = trans_b ? 0 : 1;
    const std::int64_t last = static_cast<std::int64_t>(xs->size()) - 1;
    if (x && (x->axis != last || !param(i, n, 1, in_axis, x->atoms, Site::kConsumer))) pin(*x);
    if (xs->size() < 2) return;
    Track out{last, {}};
    new_producer(i, n, w->size(out_axis), out, prunable);
    bool ok = param(i, n, 1, out_axis, out.atoms, Site::kProducer);
    if (gemm && n.has_input(2)) {
      const at::Tensor* c = initializer(n.inputs[2]);
      if (!c) ok = false;
      else if (c->dim() > 0 && c->size(c->dim() - 1) != 1)
        ok = ok && param(i, n, 2, c->dim() - 1, out.atoms, Site::kProducer);
    }
    if (!ok) pin(out);
    return set_output(n, 0, out);
  }
  if (!x) {
    // Nothing tracked in input 0: still, a tracked tensor elsewhere must be handled.
    bool any = false;
    for (const auto& in : n.inputs) any = any || tracked(in);
    if (!any) return;
    if (!kBroadcast.count(op) && op != "Concat") return pin_inputs(n);
  }
  if (op == "BatchNormalization" || op == "InstanceNormalization") {
    if (x->axis != 1 || n.outputs.size() > 1) return pin_inputs(n);
    for (std::size_t k = 1; k < n.inputs.size(); ++k)
      if (!param(i, n, k, 0, x->atoms)) return pin_inputs(n);
    return set_output(n, 0, *x);
  }
  if (kUnary.count(op)) {
    for (std::size_t k = 1; k < n.inputs.size(); ++k) {
      if (!n.has_input(k)) continue;
      const Shape* s = shape(n.inputs[k]);
      if (!s || product(*s) != 1) return pin_inputs(n);
    }
    return set_output(n, 0, *x);
  }
  if (kPool.count(op)) {
    if (x->axis != 1 || n.outputs.size() > 1) return pin_inputs(n);
    return set_output(n, 0, *x);
  }
  if (kBroadcast.count(op)) return broadcast(i, n);
  if (op == "Concat") return concat(n);
  if (op == "Flatten" || op == "Reshape") return flatten(i, n, *x);
  if (op == "Transpose") {
    const auto perm = n.attr_ints("perm");
    for (std::size_t k = 0; k < perm.size(); ++k)
      if (perm[k] == x->axis) return set_output(n, 0, Track{static_cast<std::int64_t>(k), x->atoms});
    if (perm.empty() && xs)
      return set_output(n, 0, Track{static_cast<std::int64_t>(xs->size()) - 1 - x->axis, x->atoms});
    return pin_inputs(n);
  }
  if (!xs) return pin_inputs(n);
  const std::int64_t rank = static_cast<std::int64_t>(xs->size());
  if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
    const std::int64_t axis = attr_axis(n, "axis", g_.default_opset() >= 13 ? -1 : 1, rank);
    const bool mixes = g_.default_opset() >= 13 ? axis == x->axis : x->axis >= axis;
    if (mixes) return pin_inputs(n);
    return set_output(n, 0, *x);
  }
  if (kReduce.count(op)) {
    auto axes = axes_of(n, "axes", 1, rank);
    if (!axes || axes->empty() || std::count(axes->begin(), axes->end(), x->axis)) return pin_inputs(n);
    std::int64_t axis = x->axis;
    if (n.attr_int("keepdims", 1) == 0)
      axis -= std::count_if(axes->begin(), axes->end(), [&](auto a) { return a < x->axis; });
    return set_output(n, 0, Track{axis, x->atoms});
  }
  if (op == "Squeeze" || op == "Unsqueeze") {
    auto axes = axes_of(n, "axes", 1, op == "Squeeze" ? rank : rank + 0);
    const Shape* os = shape(n.outputs[0]);
    if (!axes || !os) return pin_inputs(n);
    std::int64_t axis = x->axis;
    if (op == "Squeeze") {
      if (axes->empty() || std::count(axes->begin(), axes->end(), x->axis)) return pin_inputs(n);
      axis -= std::count_if(axes->begin(), axes->end(), [&](auto a) { return a < x->axis; });
    } else {
      const std::int64_t out_rank = static_cast<std::int64_t>(os->size());
      std::vector<bool> inserted(static_cast<std::size_t>(out_rank), false);
      for (auto a : *axes) {
        const std::int64_t p = a < 0 ? a + out_rank : a;
        if (p < 0 || p >= out_rank) return pin_inputs(n);
        inserted[static_cast<std::size_t>(p)] = true;
      }
      std::int64_t seen = -1;
      for (std::int64_t p = 0; p < out_rank; ++p)
        if (!inserted[static_cast<std::size_t>(p)] && ++seen == x->axis) axis = p;
    }
    return set_output(n, 0, Track{axis, x->atoms});
  }
  if (op == "Resize" || op == "Upsample") {
    const std::size_t scales_input = op == "Resize" ? 2 : 1;
    if (op == "Resize" && n.has_input(3)) return pin_inputs(n);
    auto scales = n.has_input(scales_input) ? constant_value(g_, n.inputs[scales_input]) : std::nullopt;
    if (!scales && n.has_attr("scales")) scales = at::tensor(n.attr_floats("scales"));
    if (!scales || scales->numel() != rank || scales->to(at::kDouble)[x->axis].item<double>() != 1.0)
      return pin_inputs(n);
    return set_output(n, 0, *x);
  }
  if (op == "Pad") {
    std::vector<std::int64_t> pads;
    if (n.has_attr("pads")) pads = n.attr_ints("pads");
    else if (auto c = n.has_input(1) ? constant_value(g_, n.inputs[1]) : std::nullopt) pads = int_values(*c);
    if (n.has_input(3) || static_cast<std::int64_t>(pads.size()) != 2 * rank || pads[x->axis] != 0 ||
        pads[x->axis + rank] != 0)
      return pin_inputs(n);
    return set_output(n, 0, *x);
  }
  if (op == "Slice") {
    auto axes = n.has_input(3) ? axes_of(n, "", 3, rank) : std::nullopt;
    if (!n.has_input(3)) {
      const Shape* starts = n.has_input(1) ? shape(n.inputs[1]) : nullptr;
      if (!starts || starts->size() != 1) return pin_inputs(n);
      axes = std::vector<std::int64_t>();
      for (std::int64_t a = 0; a < (*starts)[0]; ++a) axes->push_back(a);
    }
    if (!axes || std::count(axes->begin(), axes->end(), x->axis)) return pin_inputs(n);
    return set_output(n, 0, *x);
  }
  if (op == "Split") {
    if (attr_axis(n, "axis", 0, rank) == x->axis) return pin_inputs(n);
    for (std::size_t k = 0; k < n.outputs.size(); ++k) set_output(n, k, *x);
    return;
  }
  pin_inputs(n);
}

void ChannelAnalysis::broadcast(std::size_t i, const Node& n) {
  const Shape* os = n.outputs.empty() ? nullptr : shape(n.outputs[0]);
  if (!os) return pin_inputs(n);
  const std::int64_t R = static_cast<std::int64_t>(os->size());
  std::int64_t axis = -1;
  const Track* first = nullptr;
  for (const auto& in : n.inputs) {
    const Track* t = tracked(in);
    const Shape* s = shape(in);
    if (!t) continue;
    if (!s) return pin_inputs(n);
    const std::int64_t a = t->axis + R - static_cast<std::int64_t>(s->size());
    if ((axis >= 0 && a != axis) || (first && first->atoms.size() != t->atoms.size())) return pin_inputs(n);
    axis = a;
    if (!first) first = t;
  }
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    if (!n.has_input(k)) continue;
    const Track* t = tracked(n.inputs[k]);
    if (t) {
      for (std::size_t p = 0; p < t->atoms.size(); ++p) uf.unite(t->atoms[p], first->atoms[p]);
      continue;
    }
    const Shape* s = shape(n.inputs[k]);
    if (!s) return pin_inputs(n);
    const std::int64_t a = axis - (R - static_cast<std::int64_t>(s->size()));
    if (a < 0 || (*s)[static_cast<std::size_t>(a)] == 1) continue;
    if (!param(i, n, k, a, first->atoms)) return pin_inputs(n);
  }
  set_output(n, 0, Track{axis, first->atoms});
}

void ChannelAnalysis::concat(const Node& n) {
  const Shape* os = n.outputs.empty() ? nullptr : shape(n.outputs[0]);
  if (!os) return pin_inputs(n);
  const std::int64_t axis = attr_axis(n, "axis", 0, static_cast<std::int64_t>(os->size()));
  Track out{axis, {}};
  bool along = true;
  for (const auto& in : n.inputs)
    if (const Track* t = tracked(in); t && t->axis != axis) along = false;
  if (!along) {
    // Concat along another axis: like an elementwise op, every input carries the same channels.
    const Track* first = nullptr;
    for (const auto& in : n.inputs) {
      const Track* t = tracked(in);
      if (!t || (first && (t->axis != first->axis || t->atoms.size() != first->atoms.size()))) return pin_inputs(n);
      if (!first) first = t;
      for (std::size_t p = 0; p < t->atoms.size(); ++p) uf.unite(t->atoms[p], first->atoms[p]);
    }
    return set_output(n, 0, *first);
  }
  for (const auto& in : n.inputs) {
    if (const Track* t = tracked(in)) {
      out.atoms.insert(out.atoms.end(), t->atoms.begin(), t->atoms.end());
      continue;
    }
    const Shape* s = shape(in);
    if (!s || axis >= static_cast<std::int64_t>(s->size())) return pin_inputs(n);
    for (std::int64_t c = 0; c < (*s)[static_cast<std::size_t>(axis)]; ++c) out.atoms.push_back(new_atom(-1, c, true));
  }
  set_output(n, 0, out);
}

void ChannelAnalysis::flatten(std::size_t i, const Node& n, const Track& x) {
  const Shape* in = shape(n.inputs[0]);
  const Shape* out = shape(n.outputs[0]);
  if (!in || !out) return pin_inputs(n);
  const std::size_t a = static_cast<std::size_t>(x.axis);
  const std::int64_t C = static_cast<std::int64_t>(x.atoms.size());
  const std::int64_t inner = product(*in, a + 1);
  const bool same_prefix =
      out->size() > a && std::equal(in->begin(), in->begin() + static_cast<std::ptrdiff_t>(a), out->begin());
  if (!same_prefix) return pin_inputs(n);
  Track t{x.axis, {}};
  if ((*out)[a] == C && product(*out, a + 1) == inner) {
    t.atoms = x.atoms;  // the channel axis stays; only the axes after it change
  } else if (out->size() == a + 1 && (*out)[a] == C * inner) {
    t.atoms.reserve(static_cast<std::size_t>(C * inner));
    for (std::int64_t f = 0; f < C * inner; ++f) t.atoms.push_back(x.atoms[static_cast<std::size_t>(f / inner)]);
  } else {
    return pin_inputs(n);
  }
  if (n.op_type == "Flatten") {
    if (attr_axis(n, "axis", 1, static_cast<std::int64_t>(in->size())) > x.axis) return pin_inputs(n);
  } else if (n.has_input(1)) {
    if (const at::Tensor* c = initializer(n.inputs[1])) {
      const auto dims = int_values(*c);
      if (dims.size() != out->size()) return pin_inputs(n);
      if (dims[a] == 0 && inner != 1 && t.atoms.size() != x.atoms.size()) return pin_inputs(n);
      if (dims[a] > 0) counts.push_back({i, 1, a, t.atoms});
      for (std::size_t k = a + 1; k < dims.size(); ++k)
        if (dims[k] == 0) return pin_inputs(n);  // 0 would copy an input dim whose meaning moved
    } else if (constant_value(g_, n.inputs[1])) {
      return pin_inputs(n);  // a Constant node's shape is not rewritten
    }
    // A shape computed at run time (Shape -> Gather -> Concat) follows the pruned sizes.
  }
  set_output(n, 0, t);
}

}  // namespace sparsebit::prune_detail
