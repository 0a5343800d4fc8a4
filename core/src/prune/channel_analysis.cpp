// Channel analysis (Note [Channel removal]): channels become atoms, ops that mix channels
// unite or pin them, and every constant that reads a channel axis is recorded as a site.

#include "prune/channel_analysis.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/op_traits.h"
#include "base/core_ops.h"

namespace sparsebit::prune_detail {
namespace {

/// The value of a constant tensor: an initializer or a Constant node's `value`.
std::optional<at::Tensor> constant_value(const Graph& g, const std::string& name) {
  if (auto it = g.initializers.find(name); it != g.initializers.end()) return it->second;
  for (const Node* n : g.nodes())
    if (core_ops::is(*n, core_ops::kConstant) && !n->outputs.empty() && n->outputs[0] == name && n->has_attr("value"))
      return n->attr_tensor("value");
  return std::nullopt;
}

std::vector<std::int64_t> int_values(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous().flatten();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

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

void ChannelAnalysis::visit(std::size_t i, const Node& n,
                            const std::function<std::pair<bool, double>(const Node&)>& prunable) {
  const std::string& op = n.op_type;
  const bool onnx = n.domain.empty() || n.domain == "ai.onnx";
  if (const auto* l = registry_.op_trait<WeightedLayer>(op, n.domain)) return layer(i, n, *l, prunable);
  std::vector<std::size_t> carried;  // inputs whose channels are tracked
  for (std::size_t k = 0; k < n.inputs.size(); ++k)
    if (n.has_input(k) && tracked(n.inputs[k])) carried.push_back(k);
  if (carried.empty()) return;
  if (registry_.op_trait<Elementwise>(op, n.domain)) return broadcast(i, n);
  if (onnx && op == "Concat") return concat(n);
  if (carried.size() > 1) return pin_inputs(n);
  const Track x = *tracked(n.inputs[carried[0]]);
  if (onnx && carried[0] == 0 && (op == "Flatten" || op == "Reshape")) return flatten(i, n, x);
  follow(i, n, carried[0], x);
}

void ChannelAnalysis::layer(std::size_t i, const Node& n, const WeightedLayer& layer,
                            const std::function<std::pair<bool, double>(const Node&)>& prunable) {
  Track* x = n.inputs.empty() ? nullptr : tracked(n.inputs[0]);
  const at::Tensor* w = n.inputs.size() > 1 ? initializer(n.inputs[1]) : nullptr;
  const auto axes = w ? layer.axes(n, w->dim()) : std::nullopt;
  if (!axes) return pin_inputs(n);
  // Negative axes count from the end: they need the value's rank, which the sample run gives.
  const Shape* xs = shape(n.inputs[0]);
  const Shape* ys = n.outputs.empty() ? nullptr : shape(n.outputs[0]);
  auto resolve = [](std::int64_t axis, const Shape* s) -> std::int64_t {
    return axis >= 0 ? axis : s ? axis + static_cast<std::int64_t>(s->size()) : -1;
  };
  const std::int64_t in_axis = resolve(axes->activation, xs), out_axis = resolve(axes->output_axis(), ys);
  if (in_axis < 0 || out_axis < 0) return pin_inputs(n);
  const std::int64_t group = layer.groups(n);
  const auto bias = layer.bias_input(n);
  // The bias runs along the output channels on its last axis (extent 1: broadcast, nothing to slice).
  auto slice_bias = [&](const std::vector<int>& atoms, Site::Kind kind) {
    if (!bias || !n.has_input(*bias)) return true;
    const at::Tensor* b = initializer(n.inputs[*bias]);
    if (!b) return false;
    return b->dim() == 0 || b->size(-1) == 1 || param(i, n, *bias, b->dim() - 1, atoms, kind);
  };
  if (x) {
    if (x->axis != in_axis) return pin_inputs(n);
    // One channel in and out per group: the channels pass through, each with its weights.
    const bool depthwise = group > 1 && group == static_cast<std::int64_t>(x->atoms.size()) &&
                           w->size(axes->weight_out) == group && w->size(axes->weight_in) == 1;
    if (depthwise) {
      if (!param(i, n, 1, axes->weight_out, x->atoms) || !slice_bias(x->atoms, Site::kParam)) return pin_inputs(n);
      counts.push_back({i, -1, 0, x->atoms});
      return set_output(n, 0, Track{out_axis, x->atoms});
    }
    if (group != 1 || !param(i, n, 1, axes->weight_in, x->atoms, Site::kConsumer)) pin(*x);
  }
  if (group != 1 || (ys && ys->size() < 2)) return;  // a 1-D output has no channel axis to slice
  Track out{out_axis, {}};
  new_producer(i, n, w->size(axes->weight_out), out, prunable);
  if (!param(i, n, 1, axes->weight_out, out.atoms, Site::kProducer) || !slice_bias(out.atoms, Site::kProducer))
    pin(out);
  return set_output(n, 0, out);
}

void ChannelAnalysis::follow(std::size_t i, const Node& n, std::size_t input, const Track& x) {
  const auto* flow = registry_.op_trait<ChannelFlow>(n.op_type, n.domain);
  if (!flow) return pin_inputs(n);
  const auto version = g_.opset_imports.find(n.domain == "ai.onnx" ? "" : n.domain);
  ChannelQuery q{n,
                 g_,
                 version == g_.opset_imports.end() ? g_.default_opset() : version->second,
                 input,
                 x.axis,
                 static_cast<std::int64_t>(x.atoms.size()),
                 [this](const std::string& v) { return shape(v); },
                 [this](const std::string& v) { return constant_value(g_, v); }};
  ChannelFlowAnswer a;
  const auto* entry = registry_.op(n.op_type, n.domain);
  const std::string plugin = entry ? "plugin '" + entry->plugin + "'" : "its plugin";
  try {
    a = flow->channel_flow(q);
  } catch (const std::exception& e) {
    throw Error(n.describe() + ": the channel flow of " + plugin + " failed: " + e.what());
  }
  for (const auto& o : a.outputs) {
    const Shape* s = o.index < n.outputs.size() ? shape(n.outputs[o.index]) : nullptr;
    if (o.index >= n.outputs.size() || o.axis < 0 || (s && o.axis >= static_cast<std::int64_t>(s->size())))
      throw Error(n.describe() + ": the channel flow of " + plugin + " names output " + std::to_string(o.index) +
                  " axis " + std::to_string(o.axis) + ", which the node does not have");
  }
  for (const auto& p : a.params)
    if (p.index >= n.inputs.size() || p.axis < 0)
      throw Error(n.describe() + ": the channel flow of " + plugin + " names input " + std::to_string(p.index) +
                  " axis " + std::to_string(p.axis) + ", which the node does not have");
  if (a.outputs.empty()) return pin_inputs(n);
  for (const auto& p : a.params)
    if (!param(i, n, p.index, p.axis, x.atoms)) return pin_inputs(n);
  for (const auto& o : a.outputs) set_output(n, o.index, Track{o.axis, x.atoms});
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
