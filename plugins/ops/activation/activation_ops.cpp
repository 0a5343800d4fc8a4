// Activations (Relu ... Gelu), Softmax/LogSoftmax, and the Add/Mul that residuals and gates use.
//
// Activations and Softmax quantize their input (the original toolkit's roles), Add quantizes
// both inputs, Mul (gates, scalings) passes through.

#include <ATen/ATen.h>

#include <functional>
#include <optional>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

const std::vector<InputSpec> kQuantizeInput{{InputRole::kActivation, 0}};

class QRelu final : public QModule {
 public:
  explicit QRelu(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::relu(in.at(0))}; }
};

class QSigmoid final : public QModule {
 public:
  explicit QSigmoid(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::sigmoid(in.at(0))}; }
};

class QHardSigmoid final : public QModule {
 public:
  explicit QHardSigmoid(const OpContext& c)
      : alpha_(c.node.attr_float("alpha", 0.2)), beta_(c.node.attr_float("beta", 0.5)) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {at::clamp(in.at(0) * alpha_ + beta_, 0.0, 1.0)};
  }

 private:
  double alpha_, beta_;
};

class QClip final : public NodeQModule {
 public:
  // Opset < 11 carries min/max as attributes; later opsets as optional inputs.
  explicit QClip(const OpContext& c) : NodeQModule(c), opset_(c.opset) {
    if (opset_ < 11) {
      if (c.node.has_attr("min")) min_attr_ = c.node.attr_float("min", 0);
      if (c.node.has_attr("max")) max_attr_ = c.node.attr_float("max", 0);
    }
  }
  std::vector<InputSpec> input_specs() const override { return reading_on_host(kQuantizeInput, {1, 2}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::optional<at::Scalar> lo, hi;
    if (opset_ < 11) {
      if (min_attr_) lo = *min_attr_;
      if (max_attr_) hi = *max_attr_;
    } else {
      if (in.size() > 1 && in[1].defined()) lo = scalar(in[1], "min");
      if (in.size() > 2 && in[2].defined()) hi = scalar(in[2], "max");
    }
    if (!lo && !hi) return {x.clone()};
    if (lo && hi && lo->toDouble() <= hi->toDouble()) return {at::clamp(x, *lo, *hi)};  // one pass
    // ONNX: min(max(x, lo), hi), also when lo > hi.
    at::Tensor y = lo ? at::clamp_min(x, *lo) : x;
    return {hi ? at::clamp_max(y, *hi) : y};
  }

 private:
  at::Scalar scalar(const at::Tensor& t, const char* which) const {
    if (t.numel() != 1) throw Error(describe() + ": Clip's " + which + " must be a scalar");
    return t.reshape({}).item();
  }
  std::int64_t opset_;
  std::optional<double> min_attr_, max_attr_;
};

// Softmax and LogSoftmax: one normalization along `axis`. Before opset 13 the input is coerced
// to 2-D at `axis` and normalized over the flattened tail.
class QSoftmaxFamily final : public NodeQModule {
 public:
  QSoftmaxFamily(const OpContext& c, bool log)
      : NodeQModule(c), opset_(c.opset), axis_(c.node.attr_int("axis", c.opset >= 13 ? -1 : 1)), log_(log) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    if (opset_ >= 13) return {normalize(x, axis)};
    std::int64_t outer = 1;
    for (std::int64_t d = 0; d < axis; ++d) outer *= x.size(d);
    return {normalize(x.reshape({outer, -1}), 1).reshape(x.sizes())};
  }

 private:
  std::int64_t opset_;
  std::int64_t axis_;
  bool log_;
  at::Tensor normalize(const at::Tensor& x, std::int64_t axis) const {
    return log_ ? at::log_softmax(x, axis) : at::softmax(x, axis);
  }
};

// Hardmax: 1 at the first maximum along the axis, 0 elsewhere (a one-hot argmax, so it
// neither needs nor keeps a quantizer).
class QHardmax final : public NodeQModule {
 public:
  explicit QHardmax(const OpContext& c)
      : NodeQModule(c), opset_(c.opset), axis_(c.node.attr_int("axis", c.opset >= 13 ? -1 : 1)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    at::Tensor v = x;
    if (opset_ < 13) {  // over the flattened tail from `axis`, as Softmax before opset 13
      std::int64_t outer = 1;
      for (std::int64_t d = 0; d < axis; ++d) outer *= x.size(d);
      v = x.reshape({outer, -1});
      axis = 1;
    }
    at::Tensor y = at::zeros_like(v).scatter_(axis, at::argmax(v, axis, /*keepdim=*/true), 1);
    return {y.reshape(x.sizes())};
  }

 private:
  std::int64_t opset_;
  std::int64_t axis_;
};

// Shrink: x - bias above lambd, x + bias below -lambd, 0 between.
class QShrink final : public QModule {
 public:
  explicit QShrink(const OpContext& c) : lambd_(c.node.attr_float("lambd", 0.5)), bias_(c.node.attr_float("bias", 0)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor xf = x.to(at::kDouble);
    at::Tensor y = at::where(xf < -lambd_, xf + bias_, at::where(xf > lambd_, xf - bias_, at::zeros_like(xf)));
    return {y.to(x.scalar_type())};
  }

 private:
  double lambd_, bias_;
};

/// Activation given by a function of its input and the node's attributes.
class QActivation final : public QModule {
 public:
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  QActivation(const OpContext&, Fn fn) : fn_(std::move(fn)) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {fn_(in.at(0))}; }

 private:
  Fn fn_;
};

/// `make(node)` builds the function once per node from its attributes.
template <typename Make>
void add_activation(Registrar& r, const std::string& op, Make make) {
  r.add_op_factory(op, "", [make](const OpContext& c) { return std::make_unique<QActivation>(c, make(c.node)); });
}

class QPRelu final : public QModule {
 public:
  explicit QPRelu(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor slope = in.at(1);
    // The slope broadcasts unidirectionally (numpy rules). Models from before opset 7 (and
    // converted from them) give one slope per channel as a 1-D [C] tensor instead.
    if (slope.dim() == 1 && x.dim() > 2 && slope.numel() == x.size(1) && slope.numel() != x.size(-1)) {
      std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim() - 1), 1);
      shape[0] = slope.numel();
      slope = slope.reshape(shape);
    }
    return {at::where(x < 0, x * slope, x)};
  }
};

// Both inputs are quantized (the original toolkit's quantizing identity on each input of a
// multi-input op): ONNX Runtime then runs QLinearAdd; the tensorrt backend un-quantizes the
// branch it fuses into the producing convolution.
class QAdd final : public QModule {
 public:
  explicit QAdd(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kActivation, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::add(in.at(0), in.at(1))}; }
};

class QMul final : public QModule {
 public:
  explicit QMul(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::mul(in.at(0), in.at(1))}; }
};

/// Softmax, LogSoftmax, Hardmax: channels pass unless the op normalizes across them (along
/// `axis` from opset 13 on, over `axis` and every axis after it before).
class SoftmaxChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0) return {};
    const std::int64_t axis = normalized_axis(q.node.attr_int("axis", q.opset >= 13 ? -1 : 1), rank);
    const bool mixes = q.opset >= 13 ? axis == q.axis : q.axis >= axis;
    return mixes ? ChannelFlowAnswer{} : carried_to_output(q.axis);
  }
};

// Before 13 the op flattened x to 2-D at `axis` and normalized over the whole tail; from 13 on
// it normalizes along `axis` alone. The two agree when the axis is the last one; otherwise the
// old meaning is spelled out as Flatten -> op -> Reshape(Shape(x)).
class SoftmaxLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {13}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    const std::int64_t axis = n.attr_int("axis", 1);
    const std::int64_t rank = c.rank(n.inputs.at(0));
    if (axis == -1 || (rank >= 0 && axis == rank - 1)) {
      n.attributes["axis"] = Attribute::of_int(-1);
      c.note(n, "axis " + std::to_string(axis) + " is the last axis; unchanged");
      return;
    }
    Graph& g = c.graph();
    const std::string x = n.inputs[0], out = n.outputs.at(0);
    Node shape;
    shape.op_type = "Shape";
    shape.name = g.unique_name(n.name + "_input_shape");
    shape.inputs = {x};
    shape.outputs = {g.unique_name(x + "_shape")};
    Node flat;
    flat.op_type = "Flatten";
    flat.name = g.unique_name(n.name + "_flatten");
    flat.inputs = {x};
    flat.outputs = {g.unique_name(x + "_2d")};
    flat.attributes["axis"] = Attribute::of_int(axis);
    Node back;
    back.op_type = "Reshape";
    back.name = g.unique_name(n.name + "_restore_shape");
    const std::string flat_out = g.unique_name(out + "_2d");
    back.inputs = {flat_out, shape.outputs[0]};
    back.outputs = {out};
    n.inputs[0] = flat.outputs[0];
    n.outputs[0] = flat_out;
    n.attributes["axis"] = Attribute::of_int(-1);
    g.insert_before(&n, std::move(shape));
    g.insert_before(&n, std::move(flat));
    g.insert_after(&n, std::move(back));
    c.note(n, "axis " + std::to_string(axis) +
                  (rank >= 0 ? " of a rank-" + std::to_string(rank) + " input" : " of an input of unknown rank") +
                  " is not the last axis; rewritten as Flatten -> " + n.op_type + " -> Reshape");
  }
};

// From 11 on min and max are inputs typed like the data.
class ClipLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {11}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (!n.has_attr("min") && !n.has_attr("max")) return;
    const at::ScalarType type = float_type_of(c.elem_type(n.inputs.at(0)));
    if (n.has_attr("min")) c.set_input(n, 1, c.constant(n, "min", at::scalar_tensor(n.attr_float("min", 0), type)));
    if (n.has_attr("max")) c.set_input(n, 2, c.constant(n, "max", at::scalar_tensor(n.attr_float("max", 0), type)));
    n.attributes.erase("min");
    n.attributes.erase("max");
    c.note(n, "min/max attributes -> inputs");
  }
};

void register_traits(Registrar& r) {
  for (const char* op : {"Relu", "Sigmoid", "HardSigmoid", "Shrink", "LeakyRelu", "Elu", "Celu", "Selu",
                         "ThresholdedRelu", "HardSwish", "Mish", "Tanh", "Softplus", "Softsign", "Gelu"})
    r.add_op_traits<SameMeaning<SameChannels>>(op);
  r.add_op_traits<TraitsOf<SameChannels, ClipLift>>("Clip");
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"})
    r.add_op_traits<TraitsOf<SoftmaxChannels, SoftmaxLift>>(op);
  for (const char* op : {"Add", "Mul", "PRelu"}) r.add_op_traits<SameMeaning<Elementwise>>(op);
}

void register_all(Registrar& r) {
  r.add_op<QRelu>("Relu");
  r.add_op<QSigmoid>("Sigmoid");
  r.add_op<QHardSigmoid>("HardSigmoid");
  r.add_op<QClip>("Clip");
  r.add_op_factory("Softmax", "", [](const OpContext& c) { return std::make_unique<QSoftmaxFamily>(c, false); });
  r.add_op<QHardmax>("Hardmax");
  r.add_op<QShrink>("Shrink");
  r.add_op<QAdd>("Add");
  r.add_op<QMul>("Mul");
  r.add_op<QPRelu>("PRelu");
  r.add_op_factory("LogSoftmax", "", [](const OpContext& c) { return std::make_unique<QSoftmaxFamily>(c, true); });
  add_activation(r, "LeakyRelu", [](const Node& n) {
    const double a = n.attr_float("alpha", 0.01);
    return [a](const at::Tensor& x) { return at::where(x < 0, x * a, x); };
  });
  add_activation(r, "Elu", [](const Node& n) {
    const double a = n.attr_float("alpha", 1.0);
    return [a](const at::Tensor& x) { return at::where(x < 0, a * at::expm1(x), x); };
  });
  add_activation(r, "Celu", [](const Node& n) {
    const double a = n.attr_float("alpha", 1.0);
    return [a](const at::Tensor& x) { return at::celu(x, a); };
  });
  add_activation(r, "Selu", [](const Node& n) {
    const double a = n.attr_float("alpha", 1.67326319217681884765625),
                 g = n.attr_float("gamma", 1.05070102214813232421875);
    return [a, g](const at::Tensor& x) { return g * at::where(x <= 0, a * at::expm1(x), x); };
  });
  add_activation(r, "ThresholdedRelu", [](const Node& n) {
    const double a = n.attr_float("alpha", 1.0);
    return [a](const at::Tensor& x) { return at::where(x > a, x, at::zeros_like(x)); };
  });
  add_activation(r, "HardSwish", [](const Node&) {
    return [](const at::Tensor& x) { return x * at::clamp(x / 6.0 + 0.5, 0.0, 1.0); };
  });
  add_activation(r, "Mish",
                 [](const Node&) { return [](const at::Tensor& x) { return x * at::tanh(at::softplus(x)); }; });
  add_activation(r, "Tanh", [](const Node&) { return [](const at::Tensor& x) { return at::tanh(x); }; });
  add_activation(r, "Softplus", [](const Node&) {
    return [](const at::Tensor& x) { return at::log1p(at::exp(-x.abs())) + at::clamp_min(x, 0); };
  });
  add_activation(r, "Softsign", [](const Node&) { return [](const at::Tensor& x) { return x / (1 + x.abs()); }; });
  add_activation(r, "Gelu", [](const Node& n) {
    const std::string approx = n.attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh") throw Error(n.describe() + ": approximate must be 'none' or 'tanh'");
    return [approx](const at::Tensor& x) { return at::gelu(x, approx); };
  });
  register_traits(r);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.activation", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
