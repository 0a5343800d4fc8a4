// Channel removal (Note [Channel removal]): which channels of which tensors move together, then
// slicing every weight, bias and shape that reads them.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "glob.h"
#include "prune_internal.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

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

// Channel analysis (Note [Channel removal])

struct UnionFind {
  std::vector<int> parent;
  int make() {
    parent.push_back(static_cast<int>(parent.size()));
    return parent.back();
  }
  int find(int a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
  }
  void unite(int a, int b) { parent[find(a)] = find(b); }
};

/// Which atom sits at each position of a tensor's channel axis.
struct Track {
  std::int64_t axis = 0;
  std::vector<int> atoms;
};

/// A constant input sliced along `axis` when channels go. Producer and consumer weights are
/// zeroed in the masked model; parameters (BatchNormalization, depthwise) are not.
struct Site {
  enum Kind { kProducer, kConsumer, kParam } kind;
  std::size_t node, input;
  std::int64_t axis;
  std::vector<int> atoms;
};

/// An integer that must become the number of kept positions: a depthwise Conv's `group`
/// (input = -1) or one entry of a Reshape's constant shape.
struct CountSite {
  std::size_t node;
  int input;  ///< -1: the `group` attribute
  std::size_t position;
  std::vector<int> atoms;
};

struct Producer {
  std::size_t node;
  std::vector<int> atoms;
  double ratio = 0;
  bool skipped = false;
};

const std::set<std::string> kUnary = {
    "Relu",   "LeakyRelu", "Sigmoid", "Tanh",  "HardSigmoid", "HardSwish", "Elu",     "Selu",    "Celu",
    "Softplus", "Softsign", "Gelu",   "Mish",  "Erf",         "Exp",       "Log",     "Abs",     "Neg",
    "Sqrt",   "Reciprocal", "Floor",  "Ceil",  "Round",       "Sign",      "Identity", "Dropout", "Cast",
    "Sin",    "Cos",       "ThresholdedRelu", "Clip", "Not", "IsNaN", "IsInf", "Shrink"};
const std::set<std::string> kBroadcast = {"Add", "Sub",  "Mul",   "Div",     "Pow",  "Max",  "Min",   "Sum",
                                          "Mean", "PRelu", "Where", "Equal", "Less", "Greater", "LessOrEqual",
                                          "GreaterOrEqual", "And", "Or", "Xor", "Mod", "BitShift"};
const std::set<std::string> kPool = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"};
const std::set<std::string> kReduce = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                       "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

class ChannelAnalysis {
 public:
  ChannelAnalysis(const Graph& g, const Shapes& shapes) : g_(g), shapes_(shapes) {}

  UnionFind uf;
  std::vector<bool> pinned;  // by atom
  std::map<int, std::string> reason;  // pinned atom -> the node that pinned it
  std::vector<Site> sites;
  std::vector<CountSite> counts;
  std::vector<Producer> producers;
  std::vector<int> atom_producer;  // atom -> index into producers, -1 for pinned fillers
  std::vector<std::int64_t> atom_channel;  // atom -> output channel of its producer

  /// `prunable(node)` says whether a producer's channels may go (else they are pinned).
  void run(const std::function<std::pair<bool, double>(const Node&)>& prunable) {
    const auto nodes = g_.nodes();
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      current_ = nodes[i];
      visit(i, *nodes[i], prunable);
    }
    current_ = nullptr;
    for (const auto& o : g_.outputs)
      if (auto* t = tracked(o.name)) pin(*t);
  }

 private:
  const Graph& g_;
  const Shapes& shapes_;
  std::map<std::string, Track> tracks_;
  const Node* current_ = nullptr;

  Track* tracked(const std::string& v) {
    auto it = tracks_.find(v);
    return it == tracks_.end() ? nullptr : &it->second;
  }
  const Shape* shape(const std::string& v) const {
    auto it = shapes_.find(v);
    return it == shapes_.end() ? nullptr : &it->second;
  }
  const at::Tensor* initializer(const std::string& v) const {
    auto it = g_.initializers.find(v);
    return it == g_.initializers.end() ? nullptr : &it->second;
  }
  void pin(const Track& t) {
    for (int a : t.atoms) {
      if (!pinned[a]) reason[a] = current_ ? current_->describe() : "a graph output";
      pinned[a] = true;
    }
  }
  void pin_inputs(const Node& n) {
    for (const auto& in : n.inputs)
      if (auto* t = tracked(in)) pin(*t);
  }
  int new_atom(int producer, std::int64_t channel, bool pin_it) {
    const int a = uf.make();
    pinned.push_back(pin_it);
    if (pin_it) reason[a] = current_ && producer >= 0 ? current_->describe() + " ([sparse] skip or ratio 0)"
                                                      : current_ ? current_->describe() : std::string("?");
    atom_producer.push_back(producer);
    atom_channel.push_back(channel);
    return a;
  }
  void set_output(const Node& n, std::size_t k, Track t) {
    if (k < n.outputs.size() && !n.outputs[k].empty()) tracks_[n.outputs[k]] = std::move(t);
  }
  /// Slices constant input `input` of node `i` along `axis` with `atoms`, or pins them when
  /// the input is not an initializer of that extent. A constant read by several nodes (exporters
  /// store identical tensors once) is copied for each reader that slices it.
  bool param(std::size_t i, const Node& n, std::size_t input, std::int64_t axis, const std::vector<int>& atoms,
             Site::Kind kind = Site::kParam) {
    if (!n.has_input(input)) return true;
    const at::Tensor* c = initializer(n.inputs[input]);
    if (!c || axis >= c->dim() || c->size(axis) != static_cast<std::int64_t>(atoms.size())) return false;
    if (g_.is_graph_output(n.inputs[input])) return false;
    sites.push_back({kind, i, input, axis, atoms});
    return true;
  }
  std::int64_t attr_axis(const Node& n, const char* key, std::int64_t fallback, std::int64_t rank) const {
    std::int64_t a = n.attr_int(key, fallback);
    return a < 0 ? a + rank : a;
  }
  /// Axes from attribute `key` or, when absent, from constant input `input`; nullopt if unknown.
  std::optional<std::vector<std::int64_t>> axes_of(const Node& n, const char* key, std::size_t input, std::int64_t rank) const {
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

  void new_producer(std::size_t i, const Node& n, std::int64_t channels, Track& out,
                    const std::function<std::pair<bool, double>(const Node&)>& prunable) {
    auto [ok, ratio] = prunable(n);
    const int p = static_cast<int>(producers.size());
    producers.push_back({i, {}, ratio, !ok});
    for (std::int64_t c = 0; c < channels; ++c) producers.back().atoms.push_back(new_atom(p, c, !ok));
    out.atoms = producers.back().atoms;
  }

  void visit(std::size_t i, const Node& n, const std::function<std::pair<bool, double>(const Node&)>& prunable) {
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
        else if (c->dim() > 0 && c->size(c->dim() - 1) != 1) ok = ok && param(i, n, 2, c->dim() - 1, out.atoms, Site::kProducer);
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
      if (perm.empty() && xs) return set_output(n, 0, Track{static_cast<std::int64_t>(xs->size()) - 1 - x->axis, x->atoms});
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
      if (n.attr_int("keepdims", 1) == 0) axis -= std::count_if(axes->begin(), axes->end(), [&](auto a) { return a < x->axis; });
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
      if (!scales || scales->numel() != rank || scales->to(at::kDouble)[x->axis].item<double>() != 1.0) return pin_inputs(n);
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

  void broadcast(std::size_t i, const Node& n) {
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

  void concat(const Node& n) {
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

  /// Flatten, or a Reshape that merges the channel axis with the axes after it (into features)
  /// or only reshapes the axes after it.
  void flatten(std::size_t i, const Node& n, const Track& x) {
    const Shape* in = shape(n.inputs[0]);
    const Shape* out = shape(n.outputs[0]);
    if (!in || !out) return pin_inputs(n);
    const std::size_t a = static_cast<std::size_t>(x.axis);
    const std::int64_t C = static_cast<std::int64_t>(x.atoms.size());
    const std::int64_t inner = product(*in, a + 1);
    const bool same_prefix = out->size() > a && std::equal(in->begin(), in->begin() + static_cast<std::ptrdiff_t>(a), out->begin());
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
};

}  // namespace

void prune_channels(const Model& model, const Config& config, Sparser& sparser, const Registry& registry,
                    const std::vector<at::Tensor>& sample, Dataset* data, PruneResult& r) {
  const SparseConfig& cfg = *config.sparse;
  const std::string& sparser_name = cfg.sparser;
  // Readers of Identity(initializer) read the initializer itself (exporters share identical
  // weights between layers that way), so those weights can be sliced too.
  Graph normalized = model.graph.clone();
  for (Node* n : normalized.nodes()) {
    if (n->op_type != "Identity" || !n->has_input(0) || !normalized.initializers.count(n->inputs[0]) ||
        normalized.is_graph_output(n->outputs[0]))
      continue;
    for (auto& [reader, k] : normalized.consumers(n->outputs[0])) reader->inputs[k] = n->inputs[0];
  }
  normalized.prune_dead();
  const Graph& g = normalized;
  const Shapes shapes = run_shapes(g, registry, sample);
  ChannelAnalysis an(g, shapes);
  an.run([&](const Node& n) -> std::pair<bool, double> {
    if (matches_any(n.name, cfg.skip)) return {false, 0.0};
    const double ratio = ratio_for(cfg, n.name);
    return {ratio > 0, ratio};
  });

  // Producer scores, normalised by each producer's mean so no layer dominates a group.
  std::vector<at::Tensor> scores(an.producers.size());
  for (std::size_t p = 0; p < an.producers.size(); ++p) {
    const Producer& pr = an.producers[p];
    const Node& n = g.node(pr.node);
    const at::Tensor& w = g.initializers.at(n.inputs[1]);
    const std::int64_t out_axis = n.op_type == "ConvTranspose" ? 1 : (n.op_type == "Gemm" && n.attr_int("transB", 0)) ? 0
                                  : n.op_type == "Conv"                                                              ? 0
                                                                                                                     : 1;
    at::Tensor s = checked_scores(sparser, sparser_name, w, out_axis, n, SparsityPattern::kChannel);
    const double mean = s.mean().item<double>();
    scores[p] = mean > 0 ? s / mean : at::ones_like(s);
  }

  // Groups: producers whose channels were united anywhere.
  UnionFind groups;
  for (std::size_t p = 0; p < an.producers.size(); ++p) groups.make();
  std::map<int, int> class_owner;  // class root -> a producer
  for (std::size_t p = 0; p < an.producers.size(); ++p) {
    for (int a : an.producers[p].atoms) {
      const int root = an.uf.find(a);
      auto [it, fresh] = class_owner.emplace(root, static_cast<int>(p));
      if (!fresh) groups.unite(static_cast<int>(p), it->second);
    }
  }
  std::map<int, double> class_score;
  std::map<int, std::string> class_pinned;  // class root -> why
  for (std::size_t a = 0; a < an.pinned.size(); ++a) {
    const int root = an.uf.find(static_cast<int>(a));
    if (an.pinned[a]) class_pinned.emplace(root, an.reason[static_cast<int>(a)]);
    const int p = an.atom_producer[a];
    if (p >= 0) class_score[root] += scores[static_cast<std::size_t>(p)][an.atom_channel[a]].item<double>();
  }
  std::map<int, std::vector<int>> group_producers;
  for (std::size_t p = 0; p < an.producers.size(); ++p) group_producers[groups.find(static_cast<int>(p))].push_back(static_cast<int>(p));

  std::set<int> removed;
  for (const auto& [gid, members] : group_producers) {
    std::set<int> classes;
    double ratio = 1;
    std::string names;
    for (int p : members) {
      const Producer& pr = an.producers[static_cast<std::size_t>(p)];
      ratio = std::min(ratio, pr.skipped ? 0.0 : pr.ratio);
      if (names.size() < 200) names += (names.empty() ? "" : ", ") + g.node(pr.node).name;
      for (int a : pr.atoms) classes.insert(an.uf.find(a));
    }
    ++r.groups;
    std::vector<std::pair<double, int>> candidates;
    for (int c : classes)
      if (!class_pinned.count(c)) candidates.push_back({class_score[c], c});
    const std::int64_t total = static_cast<std::int64_t>(classes.size());
    std::int64_t keep = total - static_cast<std::int64_t>(std::floor(ratio * double(total) + 1e-9));
    keep = std::max<std::int64_t>(1, ((keep + cfg.round_to - 1) / cfg.round_to) * cfg.round_to);
    const std::int64_t pinned = total - static_cast<std::int64_t>(candidates.size());
    std::int64_t drop = std::max<std::int64_t>(0, total - std::max(keep, pinned));
    std::string why;
    for (int c : classes)
      if (auto it = class_pinned.find(c); it != class_pinned.end() && why.empty()) why = it->second;
    if (pinned > 0 && ratio > 0)
      r.notes.push_back("channels of " + names + ": " + std::to_string(pinned) + " of " + std::to_string(total) +
                        " kept, held by " + why);
    if (drop == 0) continue;
    ++r.groups_pruned;
    std::stable_sort(candidates.begin(), candidates.end());
    for (std::int64_t k = 0; k < drop; ++k) removed.insert(candidates[static_cast<std::size_t>(k)].second);
    r.channels_removed += drop;
  }

  auto keep_positions = [&](const std::vector<int>& atoms) {
    std::vector<std::int64_t> keep;
    for (std::size_t pos = 0; pos < atoms.size(); ++pos)
      if (!removed.count(an.uf.find(atoms[pos]))) keep.push_back(static_cast<std::int64_t>(pos));
    return keep;
  };
  const auto readers = initializer_readers(g);
  Graph pruned = g.clone();
  Graph masked = g.clone();
  for (const Site& s : an.sites) {
    const auto keep = keep_positions(s.atoms);
    if (keep.size() == s.atoms.size()) continue;
    // Read the current value: a weight may be sliced twice (input and output channels).
    const at::Tensor c = pruned.initializers.at(pruned.node(s.node).inputs[s.input]);
    set_input_constant(pruned, s.node, s.input, c.index_select(s.axis, at::tensor(keep, at::kLong)).contiguous(), readers);
    if (s.kind != Site::kParam) {
      at::Tensor mask = at::ones({c.size(s.axis)}, c.options());
      mask.index_fill_(0, at::tensor(keep, at::kLong), 0.0);
      std::vector<std::int64_t> view(static_cast<std::size_t>(c.dim()), 1);
      view[static_cast<std::size_t>(s.axis)] = c.size(s.axis);
      // Zero where `mask` is 1 (the removed positions).
      const at::Tensor current = masked.initializers.at(masked.node(s.node).inputs[s.input]);
      set_input_constant(masked, s.node, s.input, current * (1 - mask.view(view)), readers);
    }
  }
  if (data) {  // Note [Bias compensation]
    std::map<std::size_t, std::int64_t> axis_of;
    for (const Site& s : an.sites)
      if (s.kind == Site::kConsumer) axis_of[s.node] = g.node(s.node).op_type == "Conv" || g.node(s.node).op_type == "Gemm" ? 1 : -1;
    const auto means = input_means(g, registry, *data, config, axis_of);
    for (const Site& s : an.sites) {
      if (s.kind != Site::kConsumer || !means.count(s.node)) continue;
      const auto keep = keep_positions(s.atoms);
      if (keep.size() == s.atoms.size()) continue;
      const Node& n = g.node(s.node);
      const at::Tensor& w = g.initializers.at(n.inputs[1]);
      at::Tensor keep_mask = at::zeros({w.size(s.axis)}, w.options());
      keep_mask.index_fill_(0, at::tensor(keep, at::kLong), 1.0);
      std::vector<std::int64_t> view(static_cast<std::size_t>(w.dim()), 1);
      view[static_cast<std::size_t>(s.axis)] = w.size(s.axis);
      const at::Tensor delta = bias_shift(n, w, w * keep_mask.view(view), means.at(s.node));
      if (!delta.defined()) continue;
      // Outputs this node keeps (it may lose some as a producer too).
      at::Tensor out_keep = at::ones({delta.size(0)}, at::kDouble);
      std::vector<std::int64_t> kept_outputs;
      for (const auto& p : an.producers)
        if (p.node == s.node) kept_outputs = keep_positions(p.atoms);
      if (!kept_outputs.empty() && static_cast<std::int64_t>(kept_outputs.size()) < delta.size(0)) {
        out_keep.zero_().index_fill_(0, at::tensor(kept_outputs, at::kLong), 1.0);
        add_to_bias(pruned, s.node, delta.index_select(0, at::tensor(kept_outputs, at::kLong)), readers);
      } else {
        add_to_bias(pruned, s.node, delta, readers);
      }
      add_to_bias(masked, s.node, delta * out_keep, readers);
      ++r.bias_compensated;
    }
  }
  for (const CountSite& s : an.counts) {
    const auto kept = static_cast<std::int64_t>(keep_positions(s.atoms).size());
    if (kept == static_cast<std::int64_t>(s.atoms.size())) continue;
    Node& n = pruned.node(s.node);
    if (s.input < 0) {
      n.attributes["group"] = Attribute::of_int(kept);
      continue;
    }
    at::Tensor dims = g.initializers.at(g.node(s.node).inputs[static_cast<std::size_t>(s.input)]).clone();
    dims[static_cast<std::int64_t>(s.position)] = kept;
    set_input_constant(pruned, s.node, static_cast<std::size_t>(s.input), dims, readers);
  }
  pruned.prune_dead();
  masked.prune_dead();

  // Layers whose weights changed.
  for (std::size_t i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    if (n.inputs.size() < 2 || !g.initializers.count(n.inputs[1])) continue;
    if (n.op_type != "Conv" && n.op_type != "ConvTranspose" && n.op_type != "Gemm" && n.op_type != "MatMul") continue;
    add_layer(r, n, n.inputs[1], g.initializers.at(n.inputs[1]), pruned.initializers.at(pruned.node(i).inputs[1]));
  }

  // The shrunk model must compute what the masked one does (Note [Channel removal]).
  std::vector<at::Tensor> out_pruned, out_masked;
  try {
    run_shapes(pruned, registry, sample, &out_pruned);
  } catch (const std::exception& e) {
    throw Error(std::string("channel removal produced a model that does not run (") + e.what() +
                "); set [sparse] skip for the layer named there and report this model");
  }
  run_shapes(masked, registry, sample, &out_masked);
  for (std::size_t k = 0; k < out_masked.size(); ++k) {
    if (!out_masked[k].is_floating_point()) continue;
    if (out_pruned[k].sizes() != out_masked[k].sizes())
      throw Error("channel removal changed the shape of output '" + g.outputs[k].name + "'; report this model");
    const double scale = std::max(out_masked[k].abs().max().item<double>(), 1e-12);
    const double diff = (out_pruned[k] - out_masked[k]).abs().max().item<double>() / scale;
    r.max_masked_difference = std::max(r.max_masked_difference, diff);
  }
  if (r.max_masked_difference > 1e-4) {
    throw Error("channel removal changed the model's function (relative difference " +
                std::to_string(r.max_masked_difference) + " against the masked model); report this model");
  }
  r.pruned = Model{std::move(pruned), model.meta};
  r.masked = Model{std::move(masked), model.meta};
}

}  // namespace sparsebit::prune_detail
