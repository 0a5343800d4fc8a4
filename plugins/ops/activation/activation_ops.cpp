// Element-wise activations and arithmetic: Relu, Sigmoid, HardSigmoid, Clip, Softmax, Add, Mul.
//
// Activations and Softmax quantize their input (the original toolkit's roles). Add and Mul
// pass through: quantizing each input of a multi-input op is a separate pass's decision.

#include <ATen/ATen.h>

#include <optional>

#include "../common.h"
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
  explicit QHardSigmoid(const OpContext& c) : alpha_(c.node.attr_float("alpha", 0.2)), beta_(c.node.attr_float("beta", 0.5)) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {at::clamp(in.at(0) * alpha_ + beta_, 0.0, 1.0)};
  }

 private:
  double alpha_, beta_;
};

class QClip final : public QModule {
 public:
  // Opset < 11 carries min/max as attributes; later opsets as optional inputs.
  explicit QClip(const OpContext& c) : node_(c.node), opset_(c.opset) {
    if (opset_ < 11) {
      if (c.node.has_attr("min")) min_attr_ = c.node.attr_float("min", 0);
      if (c.node.has_attr("max")) max_attr_ = c.node.attr_float("max", 0);
    }
  }
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
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
    // ONNX: min(max(x, lo), hi), also when lo > hi.
    at::Tensor y = lo ? at::clamp_min(x, *lo) : x;
    return {hi ? at::clamp_max(y, *hi) : y};
  }

 private:
  at::Scalar scalar(const at::Tensor& t, const char* which) const {
    if (t.numel() != 1) throw Error(node_.describe() + ": Clip's " + which + " must be a scalar");
    return t.reshape({}).item();
  }
  Node node_;
  std::int64_t opset_;
  std::optional<double> min_attr_, max_attr_;
};

class QSoftmax final : public QModule {
 public:
  explicit QSoftmax(const OpContext& c)
      : node_(c.node), opset_(c.opset), axis_(c.node.attr_int("axis", c.opset >= 13 ? -1 : 1)) {}
  std::vector<InputSpec> input_specs() const override { return kQuantizeInput; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::int64_t axis = normalize_axis(axis_, x.dim(), node_);
    if (opset_ >= 13) return {at::softmax(x, axis)};
    // Before opset 13 the input is coerced to 2-D at `axis` and normalized over the flattened tail.
    std::int64_t outer = 1;
    for (std::int64_t d = 0; d < axis; ++d) outer *= x.size(d);
    return {at::softmax(x.reshape({outer, -1}), 1).reshape(x.sizes())};
  }

 private:
  Node node_;
  std::int64_t opset_;
  std::int64_t axis_;
};

class QAdd final : public QModule {
 public:
  explicit QAdd(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::add(in.at(0), in.at(1))}; }
};

class QMul final : public QModule {
 public:
  explicit QMul(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::mul(in.at(0), in.at(1))}; }
};

void register_all(Registrar& r) {
  r.add_op<QRelu>("Relu");
  r.add_op<QSigmoid>("Sigmoid");
  r.add_op<QHardSigmoid>("HardSigmoid");
  r.add_op<QClip>("Clip");
  r.add_op<QSoftmax>("Softmax");
  r.add_op<QAdd>("Add");
  r.add_op<QMul>("Mul");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.activation", "0.1.0", sparsebit::ops::register_all)
