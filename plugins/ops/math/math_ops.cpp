// Element-wise math, comparison and logic, variadic Min/Max/Sum/Mean, Where, reductions,
// ArgMax/ArgMin, TopK, CumSum and Einsum.
//
// None of these quantize their inputs: inside exported models they mostly compute shapes,
// masks and the pieces of decomposed normalizations (ReduceMean/Sub/Pow/Sqrt/Div), where an
// 8-bit grid would cost accuracy and no backend has an integer kernel to gain.

#include <ATen/ATen.h>

#include <functional>
#include <numeric>
#include <optional>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

using Tensors = std::vector<at::Tensor>;
using UnaryFn = at::Tensor (*)(const at::Tensor&);

/// One-input op given by a function; the whole family shares this class.
class QUnary final : public QModule {
 public:
  QUnary(const OpContext&, std::function<at::Tensor(const at::Tensor&)> fn) : fn_(std::move(fn)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override { return {fn_(in.at(0))}; }

 private:
  std::function<at::Tensor(const at::Tensor&)> fn_;
};

/// Two-input op with numpy broadcasting.
class QBinary final : public QModule {
 public:
  QBinary(const OpContext&, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> fn) : fn_(std::move(fn)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override { return {fn_(in.at(0), in.at(1))}; }

 private:
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> fn_;
};

template <typename Fn>
void add_unary(Registrar& r, const std::string& op, Fn fn) {
  r.add_op_factory(op, "", [fn](const OpContext& c) { return std::make_unique<QUnary>(c, fn); });
}
template <typename Fn>
void add_binary(Registrar& r, const std::string& op, Fn fn) {
  r.add_op_factory(op, "", [fn](const OpContext& c) { return std::make_unique<QBinary>(c, fn); });
}

// Integer division truncates toward zero (C semantics, as ONNX Runtime computes it).
at::Tensor onnx_div(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_floating_point() || b.is_floating_point()) return at::div(a, b);
  return at::div(a, b, "trunc");
}

// The result keeps the base's type whatever the exponent's type (Pow-12+).
at::Tensor onnx_pow(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor y = at::pow(a, b);
  return y.scalar_type() == a.scalar_type() ? y : y.to(a.scalar_type());
}

class QMod final : public QModule {
 public:
  explicit QMod(const OpContext& c) : fmod_(c.node.attr_int("fmod", 0) != 0) {
    if (!fmod_ && c.node.attr_int("fmod", 0) != 0) throw Error(c.node.describe() + ": fmod must be 0 or 1");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override {
    // fmod=0: the sign of the divisor (Python's %); fmod=1: the sign of the dividend (C fmod).
    return {fmod_ ? at::fmod(in.at(0), in.at(1)) : at::remainder(in.at(0), in.at(1))};
  }

 private:
  bool fmod_;
};

class QIsInf final : public QModule {
 public:
  explicit QIsInf(const OpContext& c)
      : neg_(c.node.attr_int("detect_negative", 1) != 0), pos_(c.node.attr_int("detect_positive", 1) != 0) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor out = at::zeros(x.sizes(), x.options().dtype(at::kBool));
    if (pos_) out = at::logical_or(out, at::isposinf(x));
    if (neg_) out = at::logical_or(out, at::isneginf(x));
    return {out};
  }

 private:
  bool neg_, pos_;
};

/// Min, Max, Sum, Mean: any number of inputs, broadcast together.
class QVariadic final : public NodeQModule {
 public:
  enum class Kind { kMin, kMax, kSum, kMean };
  QVariadic(const OpContext& c, Kind k) : NodeQModule(c), kind_(k) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override {
    if (in.empty() || !in[0].defined()) throw Error(describe() + ": needs at least one input");
    at::Tensor acc = in[0];
    for (std::size_t i = 1; i < in.size(); ++i) {
      if (!in[i].defined()) continue;
      switch (kind_) {
        case Kind::kMin: acc = at::minimum(acc, in[i]); break;
        case Kind::kMax: acc = at::maximum(acc, in[i]); break;
        default: acc = at::add(acc, in[i]); break;
      }
    }
    if (kind_ == Kind::kMean) acc = acc / static_cast<double>(in.size());
    // A single input still yields a fresh tensor of the broadcast shape.
    return {in.size() == 1 ? acc.clone() : acc};
  }

 private:
  Kind kind_;
};

class QWhere final : public QModule {
 public:
  explicit QWhere(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override { return {at::where(in.at(0).to(at::kBool), in.at(1), in.at(2))}; }
};

/// The Reduce* family. Axes come from the attribute (before opset 18; ReduceSum before 13) or
/// from the optional second input; an empty list reduces everything unless
/// noop_with_empty_axes is set.
class QReduce final : public NodeQModule {
 public:
  enum class Kind { kMean, kSum, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };
  QReduce(const OpContext& c, Kind k)
      : NodeQModule(c),
        kind_(k),
        keepdims_(c.node.attr_int("keepdims", 1) != 0),
        noop_(c.node.attr_int("noop_with_empty_axes", 0) != 0),
        attr_axes_(c.node.attr_ints("axes")) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  Tensors forward(const Tensors& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> axes = attr_axes_;
    if (in.size() > 1 && in[1].defined()) axes = int_list(in[1], node(), "axes");
    if (axes.empty()) {
      if (noop_) return {x.clone()};
      axes.resize(static_cast<std::size_t>(x.dim()));
      std::iota(axes.begin(), axes.end(), 0);
    }
    for (auto& a : axes) a = normalize_axis(a, x.dim(), node());
    std::sort(axes.begin(), axes.end());
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) throw Error(describe() + ": axes repeat an axis");
    at::Tensor y = reduce(x, axes);
    if (y.scalar_type() != x.scalar_type()) y = y.to(x.scalar_type());
    return {y};
  }

 private:
  at::Tensor reduce(const at::Tensor& x, const std::vector<std::int64_t>& axes) const {
    if (x.dim() == 0) return kind_ == Kind::kL1 ? x.abs() : kind_ == Kind::kSumSquare ? x * x : x.clone();
    switch (kind_) {
      case Kind::kMean: return at::mean(x.is_floating_point() ? x : x.to(at::kDouble), axes, keepdims_);
      case Kind::kSum: return at::sum(x, axes, keepdims_);
      case Kind::kMax: return at::amax(x, axes, keepdims_);
      case Kind::kMin: return at::amin(x, axes, keepdims_);
      case Kind::kL1: return at::sum(x.abs(), axes, keepdims_);
      case Kind::kL2: {
        // Squares in a wider type: in float16 any |x| > 256 squares past its largest value, while
        // the norm itself fits (a float16 RMSNorm written as ReduceL2 relies on this).
        const at::Tensor w =
            x.to((x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) ? at::kFloat : at::kDouble);
        return at::sqrt(at::sum(w * w, axes, keepdims_));
      }
      case Kind::kLogSum: return at::log(at::sum(x, axes, keepdims_));
      case Kind::kLogSumExp: return at::logsumexp(x, axes, keepdims_);
      case Kind::kSumSquare: return at::sum(x * x, axes, keepdims_);
      case Kind::kProd: {
        at::Tensor y = x;
        for (auto it = axes.rbegin(); it != axes.rend(); ++it) y = at::prod(y, *it, keepdims_);
        return y;
      }
    }
    return x;
  }
  Kind kind_;
  bool keepdims_, noop_;
  std::vector<std::int64_t> attr_axes_;
};

class QArgExtreme final : public NodeQModule {
 public:
  QArgExtreme(const OpContext& c, bool max)
      : NodeQModule(c),
        max_(max),
        axis_(c.node.attr_int("axis", 0)),
        keepdims_(c.node.attr_int("keepdims", 1) != 0),
        last_(c.node.attr_int("select_last_index", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    // Ties resolve to the first index; select_last_index searches the reversed axis.
    at::Tensor src = last_ ? x.flip(axis) : x;
    at::Tensor idx = max_ ? at::argmax(src, axis, keepdims_) : at::argmin(src, axis, keepdims_);
    if (last_) idx = (x.size(axis) - 1) - idx;
    return {idx};
  }

 private:
  bool max_;
  std::int64_t axis_;
  bool keepdims_, last_;
};

class QTopK final : public NodeQModule {
 public:
  explicit QTopK(const OpContext& c)
      : NodeQModule(c),
        axis_(c.node.attr_int("axis", -1)),
        largest_(c.node.attr_int("largest", 1) != 0),
        k_attr_(c.node.attr_int("k", -1)) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  Tensors forward(const Tensors& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    std::int64_t k = k_attr_;
    if (in.size() > 1 && in[1].defined()) {
      auto ks = int_list(in[1], node(), "K");
      if (ks.size() != 1) throw Error(describe() + ": K must hold one value");
      k = ks[0];
    }
    if (k < 0 || k > x.size(axis))
      throw Error(describe() + ": K=" + std::to_string(k) + " is outside [0, " + std::to_string(x.size(axis)) + "]");
    // A stable sort keeps equal values in index order, as the spec requires.
    auto [values, indices] = at::sort(x, /*stable=*/true, axis, /*descending=*/largest_);
    return {values.narrow(axis, 0, k), indices.narrow(axis, 0, k)};
  }

 private:
  std::int64_t axis_;
  bool largest_;
  std::int64_t k_attr_;
};

class QCumSum final : public NodeQModule {
 public:
  explicit QCumSum(const OpContext& c)
      : NodeQModule(c),
        exclusive_(c.node.attr_int("exclusive", 0) != 0),
        reverse_(c.node.attr_int("reverse", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  Tensors forward(const Tensors& in) override {
    const at::Tensor& x = in.at(0);
    auto axes = int_list(in.at(1), node(), "axis");
    if (axes.size() != 1) throw Error(describe() + ": axis must hold one value");
    const std::int64_t axis = normalize_axis(axes[0], x.dim(), node());
    at::Tensor src = reverse_ ? x.flip(axis) : x;
    at::Tensor y = at::cumsum(src, axis, x.scalar_type());
    if (exclusive_ && x.size(axis) > 0) {
      y = at::cat({at::zeros_like(src.narrow(axis, 0, 1)), y.narrow(axis, 0, x.size(axis) - 1)}, axis);
    }
    return {reverse_ ? y.flip(axis) : y};
  }

 private:
  bool exclusive_, reverse_;
};

class QEinsum final : public NodeQModule {
 public:
  explicit QEinsum(const OpContext& c) : NodeQModule(c), equation_(c.node.attr_string("equation", "")) {
    equation_.erase(std::remove(equation_.begin(), equation_.end(), ' '), equation_.end());
    if (equation_.empty()) throw Error(describe() + ": Einsum needs an equation");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  Tensors forward(const Tensors& in) override { return {at::einsum(equation_, in)}; }

 private:
  std::string equation_;
};

at::Tensor bool_op(const at::Tensor& x, at::Tensor (*fn)(const at::Tensor&, const at::Tensor&), const at::Tensor& y) {
  return fn(x.to(at::kBool), y.to(at::kBool));
}

/// Reductions: channels pass when the channel axis is not reduced, to the axis it becomes.
class ReduceChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0) return {};
    const auto axes = axes_of(q, "axes", 1, rank);
    if (!axes || axes->empty() || std::count(axes->begin(), axes->end(), q.axis)) return {};
    std::int64_t axis = q.axis;
    if (q.node.attr_int("keepdims", 1) == 0)
      axis -= std::count_if(axes->begin(), axes->end(), [&](std::int64_t a) { return a < q.axis; });
    return carried_to_output(axis);
  }
};

// From 10 on k is input 1.
class TopKLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {10}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (!n.has_attr("k")) c.refuse(n, "it has no 'k' attribute");
    const std::int64_t k = n.attr_int("k", 0);
    n.attributes.erase("k");
    c.set_input(n, 1, c.constant(n, "k", at::tensor(std::vector<std::int64_t>{k}, at::kLong)));
    c.note(n, "'k' attribute -> input 1");
  }
};

void register_traits(Registrar& r) {
  for (const char* op :
       {"Exp", "Log",  "Abs",  "Neg",  "Sqrt", "Reciprocal", "Floor", "Ceil",  "Round", "Sign",  "Erf",   "Sin", "Cos",
        "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",       "Asinh", "Acosh", "Atanh", "IsNaN", "IsInf", "Not"})
    r.add_op_traits<SameMeaning<SameChannels>>(op);
  for (const char* op : {"Sub", "Div", "Pow", "Mod", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And",
                         "Or", "Xor", "Min", "Max", "Sum", "Mean", "Where"})
    r.add_op_traits<SameMeaning<Elementwise>>(op);
  // ReduceSum took its axes as an input from 13, the others from 18.
  r.add_op_traits<TraitsOf<ReduceChannels, AxesBecomeInput<13>>>("ReduceSum");
  for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp", "ReduceSumSquare"})
    r.add_op_traits<TraitsOf<ReduceChannels, AxesBecomeInput<18>>>(op);
  for (const char* op : {"ArgMax", "ArgMin", "CumSum", "Einsum", "Det"}) r.add_op_traits<SameMeaning<>>(op);
  r.add_op_traits<TopKLift>("TopK");
}

void register_all(Registrar& r) {
  add_unary(r, "Sqrt", [](const at::Tensor& x) { return at::sqrt(x); });
  add_unary(r, "Exp", [](const at::Tensor& x) { return at::exp(x); });
  add_unary(r, "Log", [](const at::Tensor& x) { return at::log(x); });
  add_unary(r, "Neg", [](const at::Tensor& x) { return at::neg(x); });
  add_unary(r, "Abs", [](const at::Tensor& x) { return at::abs(x); });
  add_unary(r, "Reciprocal", [](const at::Tensor& x) { return at::reciprocal(x); });
  add_unary(r, "Floor", [](const at::Tensor& x) { return at::floor(x); });
  add_unary(r, "Ceil", [](const at::Tensor& x) { return at::ceil(x); });
  add_unary(r, "Round", [](const at::Tensor& x) { return at::round(x); });  // half to even, as ONNX
  add_unary(r, "Sign", [](const at::Tensor& x) { return at::sign(x); });
  add_unary(r, "Erf", [](const at::Tensor& x) { return at::erf(x); });
  add_unary(r, "Sin", [](const at::Tensor& x) { return at::sin(x); });
  add_unary(r, "Cos", [](const at::Tensor& x) { return at::cos(x); });
  add_unary(r, "Tan", [](const at::Tensor& x) { return at::tan(x); });
  add_unary(r, "Asin", [](const at::Tensor& x) { return at::asin(x); });
  add_unary(r, "Acos", [](const at::Tensor& x) { return at::acos(x); });
  add_unary(r, "Atan", [](const at::Tensor& x) { return at::atan(x); });
  add_unary(r, "Sinh", [](const at::Tensor& x) { return at::sinh(x); });
  add_unary(r, "Cosh", [](const at::Tensor& x) { return at::cosh(x); });
  add_unary(r, "Asinh", [](const at::Tensor& x) { return at::asinh(x); });
  add_unary(r, "Acosh", [](const at::Tensor& x) { return at::acosh(x); });
  add_unary(r, "Atanh", [](const at::Tensor& x) { return at::atanh(x); });
  add_unary(r, "IsNaN", [](const at::Tensor& x) { return at::isnan(x); });
  add_unary(r, "Not", [](const at::Tensor& x) { return at::logical_not(x.to(at::kBool)); });
  r.add_op<QIsInf>("IsInf");

  add_binary(r, "Sub", [](const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b); });
  add_binary(r, "Div", onnx_div);
  add_binary(r, "Pow", onnx_pow);
  r.add_op<QMod>("Mod");
  add_binary(r, "Equal", [](const at::Tensor& a, const at::Tensor& b) { return at::eq(a, b); });
  add_binary(r, "Greater", [](const at::Tensor& a, const at::Tensor& b) { return at::gt(a, b); });
  add_binary(r, "Less", [](const at::Tensor& a, const at::Tensor& b) { return at::lt(a, b); });
  add_binary(r, "GreaterOrEqual", [](const at::Tensor& a, const at::Tensor& b) { return at::ge(a, b); });
  add_binary(r, "LessOrEqual", [](const at::Tensor& a, const at::Tensor& b) { return at::le(a, b); });
  add_binary(r, "And", [](const at::Tensor& a, const at::Tensor& b) { return bool_op(a, at::logical_and, b); });
  add_binary(r, "Or", [](const at::Tensor& a, const at::Tensor& b) { return bool_op(a, at::logical_or, b); });
  add_binary(r, "Xor", [](const at::Tensor& a, const at::Tensor& b) { return bool_op(a, at::logical_xor, b); });

  using V = QVariadic::Kind;
  for (auto [op, kind] : {std::pair{"Min", V::kMin}, {"Max", V::kMax}, {"Sum", V::kSum}, {"Mean", V::kMean}}) {
    V k = kind;
    r.add_op_factory(op, "", [k](const OpContext& c) { return std::make_unique<QVariadic>(c, k); });
  }
  r.add_op<QWhere>("Where");

  using R = QReduce::Kind;
  for (auto [op, kind] : {std::pair{"ReduceMean", R::kMean},
                          {"ReduceSum", R::kSum},
                          {"ReduceMax", R::kMax},
                          {"ReduceMin", R::kMin},
                          {"ReduceProd", R::kProd},
                          {"ReduceL1", R::kL1},
                          {"ReduceL2", R::kL2},
                          {"ReduceLogSum", R::kLogSum},
                          {"ReduceLogSumExp", R::kLogSumExp},
                          {"ReduceSumSquare", R::kSumSquare}}) {
    R k = kind;
    r.add_op_factory(op, "", [k](const OpContext& c) { return std::make_unique<QReduce>(c, k); });
  }
  r.add_op_factory("ArgMax", "", [](const OpContext& c) { return std::make_unique<QArgExtreme>(c, true); });
  r.add_op_factory("ArgMin", "", [](const OpContext& c) { return std::make_unique<QArgExtreme>(c, false); });
  r.add_op<QTopK>("TopK");
  r.add_op<QCumSum>("CumSum");
  r.add_op<QEinsum>("Einsum");
  add_unary(r, "Det", [](const at::Tensor& x) { return at::linalg_det(x); });
  register_traits(r);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.math", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
