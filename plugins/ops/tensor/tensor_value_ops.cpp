// Ops of the tensor plugin that make a tensor or describe one: Shape, Size, the casts, constants,
// ranges and masks. Nothing of theirs is quantized.

#include <ATen/ATen.h>

#include <optional>

#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "tensor_ops.h"

namespace sparsebit::ops {
namespace {

class QShape final : public QModule {
 public:
  explicit QShape(const OpContext& c) : start_(c.node.attr_int("start", 0)), end_(c.node.attr_int("end", INT64_MAX)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t r = x.dim();
    auto clampd = [r](std::int64_t v) { return std::clamp(v < 0 ? v + r : v, std::int64_t{0}, r); };
    const std::int64_t s = clampd(start_), e = clampd(end_);
    std::vector<std::int64_t> dims(x.sizes().begin() + s, x.sizes().begin() + std::max(s, e));
    return {at::tensor(dims, at::TensorOptions().dtype(at::kLong)).to(x.device())};
  }

 private:
  std::int64_t start_, end_;
};

class QSize final : public QModule {
 public:
  explicit QSize(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {at::scalar_tensor(in.at(0).numel(), at::TensorOptions().dtype(at::kLong).device(in[0].device()))};
  }
};

class QCast final : public QModule {
 public:
  explicit QCast(const OpContext& c) : type_(scalar_type_of(c.node.attr_int("to", 0), c.node)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {in.at(0).to(type_)}; }

 private:
  at::ScalarType type_;
};

class QCastLike final : public QModule {
 public:
  explicit QCastLike(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {in.at(0).to(in.at(1).scalar_type())};
  }
};

class QConstantOfShape final : public NodeQModule {
 public:
  explicit QConstantOfShape(const OpContext& c) : NodeQModule(c) {
    value_ = c.node.has_attr("value") ? c.node.attr_tensor("value") : at::zeros({1}, at::kFloat);
    if (value_.numel() != 1) throw Error(describe() + ": value must hold exactly one element");
  }
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {0}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    auto shape = int_list(in.at(0), node(), "shape");
    for (auto v : shape)
      if (v < 0) throw Error(describe() + ": shape must be non-negative");
    return {at::full(shape, value_.reshape({}).item(), value_.options().device(in[0].device()))};
  }

 private:
  at::Tensor value_;
};

class QRange final : public NodeQModule {
 public:
  explicit QRange(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {0, 1, 2}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& start = in.at(0);
    const double s = start.item<double>(), l = in.at(1).item<double>(), d = in.at(2).item<double>();
    if (d == 0) throw Error(describe() + ": delta must not be 0");
    const double n = std::max(std::ceil((l - s) / d), 0.0);
    if (!(n < 1e10)) throw Error(describe() + ": range would hold " + std::to_string(n) + " elements");
    // start + i * delta in the inputs' type, as the spec defines it.
    at::Tensor i = at::arange(static_cast<std::int64_t>(n), start.options());
    return {(start.reshape({}) + i * in[2].reshape({})).to(start.scalar_type())};
  }

 private:
};

class QTrilu final : public NodeQModule {
 public:
  explicit QTrilu(const OpContext& c) : NodeQModule(c), upper_(c.node.attr_int("upper", 1) != 0) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    std::int64_t k = 0;
    if (in.size() > 1 && in[1].defined()) k = int_list(in[1], node(), "k").at(0);
    return {upper_ ? at::triu(in.at(0), k) : at::tril(in.at(0), k)};
  }

 private:
  bool upper_;
};

class QConstant final : public QModule {
 public:
  explicit QConstant(const OpContext& c) {
    const Node& n = c.node;
    if (n.has_attr("value")) value_ = n.attr_tensor("value");
    else if (n.has_attr("value_float")) value_ = at::scalar_tensor(n.attr_float("value_float", 0), at::kFloat);
    else if (n.has_attr("value_floats")) value_ = at::tensor(n.attr_floats("value_floats")).to(at::kFloat);
    else if (n.has_attr("value_int")) value_ = at::scalar_tensor(n.attr_int("value_int", 0), at::kLong);
    else if (n.has_attr("value_ints")) value_ = at::tensor(n.attr_ints("value_ints"), at::kLong);
    else throw Error(n.describe() + ": Constant needs a value, value_float(s) or value_int(s) attribute");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>&) override { return {value_}; }

 private:
  at::Tensor value_;
};

// EyeLike: ones on the k-th diagonal of a matrix shaped like the input.
class QEyeLike final : public NodeQModule {
 public:
  explicit QEyeLike(const OpContext& c) : NodeQModule(c), k_(c.node.attr_int("k", 0)) {
    if (c.node.has_attr("dtype")) dtype_ = scalar_type_of(c.node.attr_int("dtype", 1), c.node);
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() != 2) throw Error(describe() + ": input must be 2-D, got rank " + std::to_string(x.dim()));
    at::Tensor rows = at::arange(x.size(0), x.options().dtype(at::kLong)).unsqueeze(1);
    at::Tensor cols = at::arange(x.size(1), x.options().dtype(at::kLong)).unsqueeze(0);
    return {(cols - rows == k_).to(dtype_ ? *dtype_ : x.scalar_type())};
  }

 private:
  std::int64_t k_;
  std::optional<at::ScalarType> dtype_;
};

}  // namespace

void register_value_ops(Registrar& r) {
  r.add_op<QShape>("Shape");
  r.add_op<QSize>("Size");
  r.add_op<QCast>("Cast");
  r.add_op<QCastLike>("CastLike");
  r.add_op<QConstantOfShape>("ConstantOfShape");
  r.add_op<QRange>("Range");
  r.add_op<QTrilu>("Trilu");
  r.add_op<QConstant>("Constant");
  r.add_op<QEyeLike>("EyeLike");
}

}  // namespace sparsebit::ops
