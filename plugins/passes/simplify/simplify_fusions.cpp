// Simplify passes that turn a pattern of ops into the one op it writes out: fuse_matmul_add,
// fuse_hardsigmoid, fuse_hardswish, fuse_gelu, fuse_layernorm, fuse_pad.

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

// fuse_hardsigmoid: HardSigmoid and HardSwish written out as arithmetic, as PaddlePaddle's and
// older exporters write them, become HardSigmoid: Clip(x + 3, 0, 6) / 6 -> HardSigmoid(x) (alpha
// 1/6, beta 1/2) and x * Clip(x + 3, 0, 6) / 6 -> x * HardSigmoid(x) (fuse_hardswish then makes
// HardSwish of that from opset 14). Four element-wise passes become one or two. A division by 6
// may also be a multiplication by 1/6.
class FuseHardSigmoid final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern swish;
    swish.node("add", {"Add"}, {}, Inputs::kAnyOrder, plus_three);
    swish.node("clip", {"Clip"}, {"add"}, Inputs::kOrdered, zero_to_six);
    swish.node("mul", {"Mul"}, {"clip"}, Inputs::kAnyOrder);
    swish.node("div", {"Div", "Mul"}, {"mul"}, Inputs::kOrdered, by_six);
    swish.joint([](const Match& m, const Graph& graph) {
      return other_input(*m.at("mul"), m.at("clip")->outputs[0]) == x_of(graph, *m.at("add"));
    });
    std::size_t n = rewrite(g, swish, [](Graph& graph, const Match& m) {
      const std::string x = x_of(graph, *m.at("add"));
      Node& mul = *m.at("mul");
      Node hs = hard_sigmoid(graph, x, m.at("add")->name);
      mul.inputs = {x, hs.outputs[0]};
      mul.outputs = {m.at("div")->outputs[0]};
      graph.insert_before(&mul, std::move(hs));
      graph.erase(m.at("div"));
      return true;
    });
    Pattern sigmoid;
    sigmoid.node("add", {"Add"}, {}, Inputs::kAnyOrder, plus_three);
    sigmoid.node("clip", {"Clip"}, {"add"}, Inputs::kOrdered, zero_to_six);
    sigmoid.node("div", {"Div", "Mul"}, {"clip"}, Inputs::kOrdered, by_six);
    n += rewrite(g, sigmoid, [](Graph& graph, const Match& m) {
      Node hs = hard_sigmoid(graph, x_of(graph, *m.at("add")), m.at("add")->name);
      hs.outputs = {m.at("div")->outputs[0]};
      graph.insert_before(m.at("div"), std::move(hs));
      graph.erase(m.at("div"));
      return true;
    });
    return n > 0;
  }

 private:
  static std::string x_of(const Graph& g, const Node& add) {
    return scalar(g, add.inputs[1]) ? add.inputs[0] : add.inputs[1];
  }
  static bool plus_three(const Node& n, const Graph& g) {
    if (n.inputs.size() != 2) return false;
    const auto a = scalar(g, n.inputs[0]), b = scalar(g, n.inputs[1]);
    return (b && near(*b, 3.0) && !a) || (a && near(*a, 3.0) && !b);
  }
  static bool zero_to_six(const Node& n, const Graph& g) {
    if (n.has_attr("min") || n.has_attr("max"))  // before opset 11
      return near(n.attr_float("min", -1), 0.0) && near(n.attr_float("max", -1), 6.0);
    if (!n.has_input(1) || !n.has_input(2)) return false;
    const auto lo = scalar(g, n.inputs[1]), hi = scalar(g, n.inputs[2]);
    return lo && hi && near(*lo, 0.0) && near(*hi, 6.0);
  }
  static bool by_six(const Node& n, const Graph& g) {
    if (n.inputs.size() != 2) return false;
    const auto c = scalar(g, n.inputs[1]);
    return c && near(*c, n.op_type == "Div" ? 6.0 : 1.0 / 6);
  }
  static Node hard_sigmoid(Graph& g, const std::string& x, const std::string& base) {
    Node hs;
    hs.op_type = "HardSigmoid";
    hs.name = g.unique_name(base + "_hardsigmoid");
    hs.inputs = {x};
    hs.outputs = {g.unique_name(base + "_hardsigmoid")};
    hs.attributes["alpha"] = Attribute::of_float(1.0 / 6);
    hs.attributes["beta"] = Attribute::of_float(0.5);
    return hs;
  }
};

class FuseMatMulAdd final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern p;
    p.node("mm", {"MatMul"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      auto w = constant(graph, n.inputs.size() > 1 ? n.inputs[1] : "");
      return w && w->dim() == 2;
    });
    p.node("add", {"Add"}, {"mm"}, Inputs::kAnyOrder);
    p.joint([](const Match& m, const Graph& graph) {
      const Node& mm = *m.at("mm");
      auto b = constant(graph, other_input(*m.at("add"), mm.outputs[0]));
      return b && b->dim() == 1 && b->numel() == graph.initializers.at(mm.inputs[1]).size(1);
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& mm = *m.at("mm");
             const Node& add = *m.at("add");
             if (!two_dimensional(graph, mm.inputs[0])) return false;  // Gemm's A must be 2-D
             mm.op_type = "Gemm";
             mm.inputs.push_back(other_input(add, mm.outputs[0]));
             mm.outputs[0] = add.outputs[0];
             graph.erase(&add);
             return true;
           }) > 0;
  }

 private:
  /// Whether `value` is known to be 2-D without running the model: a 2-D graph input, or the
  /// output of Flatten, Gemm or a Reshape to a constant two-element shape.
  static bool two_dimensional(Graph& g, const std::string& value) {
    for (const auto& in : g.inputs)
      if (in.name == value) return in.has_shape && in.shape.size() == 2;
    const Node* p = g.producer(value);
    if (!p || !p->domain.empty()) return false;
    if (p->op_type == "Flatten" || p->op_type == "Gemm") return true;
    if (p->op_type == "Reshape") {
      auto shape = constant(g, p->inputs.size() > 1 ? p->inputs[1] : "");
      return shape && shape->numel() == 2;
    }
    return false;
  }
};

class FuseHardSwish final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    if (!opset_at_least(g, 14, "fuse_hardswish", "HardSwish")) return false;
    Pattern p;
    p.node("hs", {"HardSigmoid"}, {}, Inputs::kOrdered, [](const Node& n, const Graph&) {
      return near(n.attr_float("alpha", 0.2), 1.0 / 6) && near(n.attr_float("beta", 0.5), 0.5);
    });
    p.node("mul", {"Mul"}, {"hs"}, Inputs::kAnyOrder);
    p.joint([](const Match& m, const Graph&) {
      return other_input(*m.at("mul"), m.at("hs")->outputs[0]) == m.at("hs")->inputs[0];
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& hs = *m.at("hs");
             const Node& mul = *m.at("mul");
             hs.op_type = "HardSwish";
             hs.attributes.clear();
             hs.outputs[0] = mul.outputs[0];
             graph.erase(&mul);
             return true;
           }) > 0;
  }
};

class FuseGelu final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    if (!opset_at_least(g, 20, "fuse_gelu", "Gelu")) return false;
    // torch exports Gelu as Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5) (either operand order).
    Pattern p;
    p.node("div", {"Div"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      auto c = scalar(graph, n.inputs.size() > 1 ? n.inputs[1] : "");
      return c && near(*c, std::sqrt(2.0));
    });
    p.node("erf", {"Erf"}, {"div"});
    p.node("add", {"Add"}, {"erf"}, Inputs::kAnyOrder, [](const Node& n, const Graph& graph) {
      auto a = scalar(graph, n.inputs[0]), b = scalar(graph, n.inputs[1]);
      return (a && near(*a, 1.0)) || (b && near(*b, 1.0));
    });
    p.node("mul", {"Mul"}, {"add"}, Inputs::kAnyOrder);
    p.node("half", {"Mul"}, {"mul"}, Inputs::kAnyOrder, [](const Node& n, const Graph& graph) {
      auto a = scalar(graph, n.inputs[0]), b = scalar(graph, n.inputs[1]);
      return (a && near(*a, 0.5)) || (b && near(*b, 0.5));
    });
    p.joint([](const Match& m, const Graph&) {
      return other_input(*m.at("mul"), m.at("add")->outputs[0]) == m.at("div")->inputs[0];
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& div = *m.at("div");
             div.op_type = "Gelu";
             div.inputs.resize(1);
             div.attributes.clear();
             div.outputs[0] = m.at("half")->outputs[0];
             graph.erase(m.at("half"));  // the rest becomes dead and is pruned
             return true;
           }) > 0;
  }
};

class FuseLayerNorm final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    if (!opset_at_least(g, 17, "fuse_layernorm", "LayerNormalization")) return false;
    return rewrite(g, pattern(), fuse) > 0;
  }

 private:
  /// Trailing axes (all negative, consecutive, ending at -1) of a ReduceMean, as given.
  static std::optional<std::vector<std::int64_t>> axes(const Node& n, const Graph& g) {
    if (n.attr_int("keepdims", 1) != 1) return std::nullopt;
    std::vector<std::int64_t> a = n.attr_ints("axes");
    if (n.has_input(1)) {
      auto t = constant(g, n.inputs[1]);
      if (!t) return std::nullopt;
      at::Tensor v = t->to(at::kLong).contiguous().reshape({-1});
      a.assign(v.data_ptr<std::int64_t>(), v.data_ptr<std::int64_t>() + v.numel());
    }
    std::sort(a.begin(), a.end());
    if (a.empty() || a.back() != -1) return std::nullopt;
    for (std::size_t i = 1; i < a.size(); ++i)
      if (a[i] != a[i - 1] + 1) return std::nullopt;
    return a;
  }

  static Pattern pattern() {
    auto reduce = [](const Node& n, const Graph& g) { return axes(n, g).has_value(); };
    Pattern p;
    p.node("mean", {"ReduceMean"}, {}, Inputs::kOrdered, reduce);
    p.node("sub", {"Sub"}, {"", "mean"});
    p.node("pow", {"Pow"}, {"sub"}, Inputs::kOrdered, [](const Node& n, const Graph& g) {
      auto e = scalar(g, n.inputs.size() > 1 ? n.inputs[1] : "");
      return e && *e == 2.0;
    });
    p.node("var", {"ReduceMean"}, {"pow"}, Inputs::kOrdered, reduce);
    p.node("eps", {"Add"}, {"var"}, Inputs::kAnyOrder);
    p.node("sqrt", {"Sqrt"}, {"eps"});
    p.node("div", {"Div"}, {"sub", "sqrt"});
    p.node("scale", {"Mul"}, {"div"}, Inputs::kAnyOrder);
    p.node("shift", {"Add"}, {"scale"}, Inputs::kAnyOrder);
    p.joint([](const Match& m, const Graph& g) {
      const Node& mean = *m.at("mean");
      if (m.at("sub")->inputs[0] != mean.inputs[0] || axes(mean, g) != axes(*m.at("var"), g)) return false;
      if (!scalar(g, other_input(*m.at("eps"), m.at("var")->outputs[0]))) return false;
      auto gamma = constant(g, other_input(*m.at("scale"), m.at("div")->outputs[0]));
      auto beta = constant(g, other_input(*m.at("shift"), m.at("scale")->outputs[0]));
      return gamma && beta && gamma->dim() >= 1 && beta->dim() >= 1;
    });
    return p;
  }

  static bool fuse(Graph& g, const Match& m) {
    const Node& mean = *m.at("mean");
    Node ln;
    ln.name = g.unique_name(m.at("div")->name + "_layernorm");
    ln.op_type = "LayerNormalization";
    ln.attributes["axis"] = Attribute::of_int(axes(mean, g)->front());
    ln.attributes["epsilon"] = Attribute::of_float(*scalar(g, other_input(*m.at("eps"), m.at("var")->outputs[0])));
    ln.inputs = {mean.inputs[0], other_input(*m.at("scale"), m.at("div")->outputs[0]),
                 other_input(*m.at("shift"), m.at("scale")->outputs[0])};
    Node* tail = m.at("shift");
    ln.outputs = {tail->outputs[0]};
    g.insert_after(tail, std::move(ln));
    g.erase(tail);  // the rest becomes dead and is pruned
    return true;
  }
};

class FusePad final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern p;
    p.node("pad", {"Pad"}, {}, Inputs::kOrdered,
           [](const Node& n, const Graph& graph) { return spatial_pads(graph, n).has_value(); });
    p.node("conv", {"Conv"}, {"pad"}, Inputs::kOrdered,
           [](const Node& n, const Graph&) { return n.attr_string("auto_pad", "NOTSET") == "NOTSET"; });
    p.joint([](const Match& m, const Graph& graph) {
      const auto pads = *spatial_pads(graph, *m.at("pad"));
      const Node& conv = *m.at("conv");
      const auto own = conv.attr_ints("pads");
      return own.empty() || own.size() == pads.size();
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             const Node& pad = *m.at("pad");
             Node& conv = *m.at("conv");
             std::vector<std::int64_t> pads = *spatial_pads(graph, pad);
             const auto own = conv.attr_ints("pads");
             for (std::size_t i = 0; i < own.size(); ++i) pads[i] += own[i];
             conv.attributes["pads"] = Attribute::of_ints(pads);
             conv.inputs[0] = pad.inputs[0];
             graph.erase(&pad);
             return true;
           }) > 0;
  }

 private:
  /// A Pad's amounts on the axes after the first two, in Conv's order (all begins, then all
  /// ends), when it pads with zeros, only there, and never crops.
  static std::optional<std::vector<std::int64_t>> spatial_pads(const Graph& g, const Node& n) {
    if (n.attr_string("mode", "constant") != "constant" || n.inputs.empty()) return std::nullopt;
    std::vector<std::int64_t> pads;
    if (g.default_opset() < 11) {
      pads = n.attr_ints("pads");
      if (n.attr_float("value", 0.0) != 0.0) return std::nullopt;
    } else {
      if (!n.has_input(1) || (n.inputs.size() > 3 && !n.inputs[3].empty())) return std::nullopt;  // no axes input
      auto t = constant(g, n.inputs[1]);
      if (!t || t->dim() != 1) return std::nullopt;
      const at::Tensor p = t->to(at::kLong).contiguous();
      pads.assign(p.data_ptr<std::int64_t>(), p.data_ptr<std::int64_t>() + p.numel());
      if (n.has_input(2)) {
        auto v = constant(g, n.inputs[2]);
        if (!v || v->numel() != 1 || v->to(at::kDouble).reshape({}).item<double>() != 0.0) return std::nullopt;
      }
    }
    const std::size_t rank = pads.size() / 2;
    if (pads.size() % 2 != 0 || rank < 3) return std::nullopt;
    for (auto v : pads)
      if (v < 0) return std::nullopt;
    if (pads[0] || pads[1] || pads[rank] || pads[rank + 1]) return std::nullopt;
    std::vector<std::int64_t> out(pads.begin() + 2, pads.begin() + static_cast<std::ptrdiff_t>(rank));
    out.insert(out.end(), pads.begin() + static_cast<std::ptrdiff_t>(rank) + 2, pads.end());
    return out;
  }
};

}  // namespace

void register_fusions(Registrar& r) {
  r.add_pass<FuseMatMulAdd>("fuse_matmul_add", PassSchedule{600, true});
  // On by default for ONNX Runtime only, as fuse_affine (simplify_folds.cpp).
  r.add_pass<FuseHardSigmoid>("fuse_hardsigmoid", PassSchedule{300, true, {"onnxruntime"}});
  r.add_pass<FuseHardSwish>("fuse_hardswish", PassSchedule{700, true});
  r.add_pass<FuseGelu>("fuse_gelu", PassSchedule{800, true});
  r.add_pass<FuseLayerNorm>("fuse_layernorm", PassSchedule{900, true});
  r.add_pass<FusePad>("fuse_pad", PassSchedule{1000, true});
}

}  // namespace sparsebit::passes::simplify
