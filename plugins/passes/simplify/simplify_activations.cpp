// Simplify passes for what TensorFlow exporters write around activations: fuse_activations
// and move_transposes.

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "simplify_common.h"
#include "sparsebit/sdk/batchnorm.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/pattern.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes::simplify {
namespace {

/// A scalar floating constant operand that broadcasts to nothing larger than x: rank 0, or
/// rank 1 when x comes from an op whose output has rank >= 2.
std::optional<double> activation_constant(const Graph& g, const std::string& name, const std::string& x) {
  auto t = constant(g, name);
  if (!t || t->numel() != 1 || !t->is_floating_point() || t->dim() > 1) return std::nullopt;
  if (t->dim() == 1) {
    static const std::set<std::string> ranked = {"Conv",    "ConvTranspose", "BatchNormalization",   "Gemm",
                                                 "MaxPool", "AveragePool",   "InstanceNormalization"};
    const Node* from = g.producer(x);
    if (!from || !ranked.count(from->op_type)) return std::nullopt;
  }
  return t->reshape({}).item<double>();
}

class FuseActivations final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    bool changed = fuse_leaky_relu(g);
    changed = fuse_constant_bounds(g) || changed;
    changed = merge_bounds(g) || changed;
    return changed;
  }

  // Max(x, Mul(x, a)) = x for x >= 0 and a * x below: LeakyRelu(alpha = a) for 0 <= a < 1.
  static bool fuse_leaky_relu(Graph& g) {
    Pattern p;
    p.node("mul", {"Mul"});
    p.node("max", {"Max"}, {"mul"}, Inputs::kAnyOrder,
           [](const Node& n, const Graph&) { return n.inputs.size() == 2; });
    p.joint([](const Match& m, const Graph& graph) {
      const Node &mul = *m.at("mul"), &max = *m.at("max");
      const std::string x = other_input(max, mul.outputs[0]);
      if (x.empty() || mul.inputs.size() != 2) return false;
      const std::string a = other_input(mul, x);
      if (a.empty()) return false;
      auto alpha = activation_constant(graph, a, x);
      return alpha && *alpha >= 0 && *alpha < 1;
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& max = *m.at("max");
             const Node& mul = *m.at("mul");
             const std::string x = other_input(max, mul.outputs[0]);
             const double alpha = *activation_constant(graph, other_input(mul, x), x);
             max.op_type = alpha == 0 ? "Relu" : "LeakyRelu";
             max.inputs = {x};
             max.attributes.clear();
             if (alpha != 0) max.attributes["alpha"] = Attribute::of_float(alpha);
             graph.erase(&mul);
             return true;
           }) > 0;
  }

  // Max(x, 0) is Relu; Max(x, c) and Min(x, c) are Clip with one bound.
  static bool fuse_constant_bounds(Graph& g) {
    Pattern p;
    p.node("op", {"Max", "Min"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      if (n.inputs.size() != 2) return false;
      const bool c0 = bool(constant(graph, n.inputs[0])), c1 = bool(constant(graph, n.inputs[1]));
      return c0 != c1 && activation_constant(graph, c0 ? n.inputs[0] : n.inputs[1], c0 ? n.inputs[1] : n.inputs[0]);
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& n = *m.at("op");
             const bool first_constant = bool(constant(graph, n.inputs[0]));
             const std::string x = n.inputs[first_constant ? 1 : 0], c = n.inputs[first_constant ? 0 : 1];
             const double bound = *activation_constant(graph, c, x);
             const bool lower = n.op_type == "Max";
             if (lower && bound == 0) {
               n.op_type = "Relu";
               n.inputs = {x};
               return true;
             }
             return clip_with_bounds(graph, n, x, lower ? std::optional<double>(bound) : std::nullopt,
                                     lower ? std::nullopt : std::optional<double>(bound), c);
           }) > 0;
  }

  // Relu or Clip, then Clip: one Clip on the intersection of the two ranges (where they meet;
  // apart, the result would be a constant, left as is).
  static bool merge_bounds(Graph& g) {
    Pattern p;
    p.node("inner", {"Relu", "Clip"});
    p.node("outer", {"Clip"}, {"inner"});
    p.joint([](const Match& m, const Graph& graph) {
      auto a = clip_bounds(graph, *m.at("inner")), b = clip_bounds(graph, *m.at("outer"));
      if (!a || !b) return false;
      auto [lo, hi] = intersection(*a, *b);
      return !lo || !hi || *lo <= *hi;
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& outer = *m.at("outer");
             const Node& inner = *m.at("inner");
             auto [lo, hi] = intersection(*clip_bounds(graph, inner), *clip_bounds(graph, outer));
             const std::string x = inner.inputs[0];
             std::string like;  // a bound constant of either Clip (opset >= 11): the type of the new ones
             for (const Node* n : {static_cast<const Node*>(&outer), &inner})
               for (std::size_t i = 1; i < n->inputs.size() && like.empty(); ++i) like = n->inputs[i];
             if (like.empty() && graph.default_opset() >= 11) return false;
             if (!clip_with_bounds(graph, outer, x, lo, hi, like)) return false;
             graph.erase(&inner);
             return true;
           }) > 0;
  }

  using Bounds = std::pair<std::optional<double>, std::optional<double>>;

  static Bounds intersection(const Bounds& a, const Bounds& b) {
    auto pick = [](const std::optional<double>& x, const std::optional<double>& y,
                   bool lower) -> std::optional<double> {
      if (!x) return y;
      if (!y) return x;
      return lower ? std::max(*x, *y) : std::min(*x, *y);
    };
    return {pick(a.first, b.first, true), pick(a.second, b.second, false)};
  }

  /// The (lower, upper) bounds of a Relu or of a Clip whose bounds are constant (unset: none).
  static std::optional<std::pair<std::optional<double>, std::optional<double>>> clip_bounds(const Graph& g,
                                                                                            const Node& n) {
    if (n.op_type == "Relu") return std::make_pair(std::optional<double>(0.0), std::optional<double>());
    std::pair<std::optional<double>, std::optional<double>> b;
    if (g.default_opset() < 11) {
      if (n.has_attr("min")) b.first = n.attr_float("min", 0);
      if (n.has_attr("max")) b.second = n.attr_float("max", 0);
      return b;
    }
    for (std::size_t i = 1; i < 3; ++i) {
      if (!n.has_input(i)) continue;
      auto t = constant(g, n.inputs[i]);
      if (!t || t->numel() != 1) return std::nullopt;
      (i == 1 ? b.first : b.second) = t->reshape({}).item<double>();
    }
    return b;
  }

  /// Turns `n` into Clip(x) with the given bounds: inputs at opset >= 11 (constants typed like
  /// `like`, a constant of x's type), attributes before.
  static bool clip_with_bounds(Graph& g, Node& n, const std::string& x, std::optional<double> lo,
                               std::optional<double> hi, const std::string& like) {
    const bool as_inputs = g.default_opset() >= 11;
    auto type_of = constant(g, like);
    if (as_inputs && !type_of) return false;
    n.op_type = "Clip";
    n.attributes.clear();
    if (!as_inputs) {
      n.inputs = {x};
      if (lo) n.attributes["min"] = Attribute::of_float(*lo);
      if (hi) n.attributes["max"] = Attribute::of_float(*hi);
      return true;
    }
    n.inputs = {x, "", ""};
    for (int i : {0, 1}) {
      const std::optional<double>& v = i == 0 ? lo : hi;
      if (!v) continue;
      const std::string name = g.unique_name(n.name + (i == 0 ? "_min" : "_max"));
      g.initializers[name] = at::full({}, *v, type_of->options());
      n.inputs[static_cast<std::size_t>(i) + 1] = name;
    }
    while (n.inputs.size() > 1 && n.inputs.back().empty()) n.inputs.pop_back();
    return true;
  }
};

class MoveTransposes final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    // One input, each element on its own: the same result in any layout.
    static const std::set<std::string> elementwise = {
        "Relu", "LeakyRelu", "Clip",     "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu",
        "Gelu", "Softplus",  "Softsign", "Mish",    "Abs",         "Neg",       "Exp",  "Log", "Sqrt", "Erf"};
    Pattern p;
    p.node("t", {"Transpose"});
    p.node("act", std::vector<std::string>(elementwise.begin(), elementwise.end()), {"t"}, Inputs::kOrdered,
           [](const Node& n, const Graph& graph) {
             if (!n.domain.empty() || n.outputs.size() != 1) return false;
             for (std::size_t i = 1; i < n.inputs.size(); ++i)  // Clip's bounds: scalars by definition
               if (!n.inputs[i].empty() && !constant(graph, n.inputs[i])) return false;
             return true;
           });
    const bool moved = rewrite(g, p, [](Graph& graph, const Match& m) {
                         Node& t = *m.at("t");
                         Node act = *m.at("act");
                         const std::string out = act.outputs[0];
                         act.inputs[0] = t.inputs[0];
                         act.outputs[0] = graph.unique_name(out + "_untransposed");
                         graph.erase(m.at("act"));
                         t.inputs[0] = act.outputs[0];
                         t.outputs[0] = out;
                         graph.insert_before(&t, std::move(act));
                         return true;
                       }) > 0;
    // Activations that a Transpose kept apart may now be one Clip.
    return (moved && FuseActivations::merge_bounds(g)) || moved;
  }
};

}  // namespace

void register_activations(Registrar& r) {
  r.add_pass<FuseActivations>("fuse_activations", PassSchedule{1100, true});
  r.add_pass<MoveTransposes>("move_transposes", PassSchedule{1200, true});
}

}  // namespace sparsebit::passes::simplify
