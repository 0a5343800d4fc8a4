// Data-movement ops: Identity, Dropout, Flatten, Reshape, Concat, Pad. They pass quantization
// through (quantizing before or after a reshape is the same), except Identity, which the
// original toolkit uses as an explicit quantization point.

#include <ATen/ATen.h>

#include "../common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

class QIdentity final : public QModule {
 public:
  explicit QIdentity(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {in.at(0)}; }
};

class QDropout final : public QModule {
 public:
  explicit QDropout(const OpContext& c) : node_(c.node) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const bool training = in.size() > 2 && in[2].defined() && in[2].reshape({}).item<bool>();
    const double ratio = in.size() > 1 && in[1].defined() ? in[1].reshape({}).item<double>() : 0.5;
    if (training && ratio > 0) {
      throw Error(node_.describe() + ": Dropout in training mode (random masks) is not supported; export the "
                                     "model in eval mode");
    }
    return {x, at::ones(x.sizes(), x.options().dtype(at::kBool))};
  }

 private:
  Node node_;
};

class QFlatten final : public QModule {
 public:
  explicit QFlatten(const OpContext& c) : node_(c.node), axis_(c.node.attr_int("axis", 1)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::int64_t axis = axis_ < 0 ? axis_ + x.dim() : axis_;
    if (axis < 0 || axis > x.dim()) throw Error(node_.describe() + ": axis out of range");
    std::int64_t outer = 1;
    for (std::int64_t d = 0; d < axis; ++d) outer *= x.size(d);
    std::int64_t inner = 1;
    for (std::int64_t d = axis; d < x.dim(); ++d) inner *= x.size(d);
    return {x.reshape({outer, inner})};
  }

 private:
  Node node_;
  std::int64_t axis_;
};

class QReshape final : public QModule {
 public:
  explicit QReshape(const OpContext& c) : node_(c.node), allowzero_(c.node.attr_int("allowzero", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor s = in.at(1).to(at::kCPU, at::kLong).contiguous();
    std::vector<std::int64_t> shape(s.data_ptr<std::int64_t>(), s.data_ptr<std::int64_t>() + s.numel());
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 0 && !allowzero_) {
        if (static_cast<std::int64_t>(i) >= x.dim()) throw Error(node_.describe() + ": shape has 0 at a position the input lacks");
        shape[i] = x.size(static_cast<std::int64_t>(i));
      }
    }
    return {x.reshape(shape)};
  }

 private:
  Node node_;
  bool allowzero_;
};

class QConcat final : public QModule {
 public:
  explicit QConcat(const OpContext& c) : node_(c.node), axis_(c.node.attr_int("axis", 0)) {
    if (!c.node.has_attr("axis")) throw Error(node_.describe() + ": Concat needs an axis attribute");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    std::vector<at::Tensor> parts;
    for (const auto& t : in)
      if (t.defined()) parts.push_back(t);
    if (parts.empty()) throw Error(node_.describe() + ": no inputs");
    return {at::cat(parts, normalize_axis(axis_, parts[0].dim(), node_))};
  }

 private:
  Node node_;
  std::int64_t axis_;
};

class QPad final : public QModule {
 public:
  explicit QPad(const OpContext& c) : node_(c.node), opset_(c.opset), mode_(c.node.attr_string("mode", "constant")) {
    if (mode_ != "constant" && mode_ != "reflect" && mode_ != "edge" && mode_ != "wrap")
      throw Error(node_.describe() + ": unknown mode '" + mode_ + "'");
    if (opset_ < 11) {
      pads_attr_ = c.node.attr_ints("pads");
      value_attr_ = c.node.attr_float("value", 0.0);
    }
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t r = x.dim();
    std::vector<std::int64_t> pads;
    double value = 0.0;
    if (opset_ < 11) {
      pads = pads_attr_;
      value = value_attr_;
    } else {
      at::Tensor p = in.at(1).to(at::kCPU, at::kLong).contiguous();
      pads.assign(p.data_ptr<std::int64_t>(), p.data_ptr<std::int64_t>() + p.numel());
      if (in.size() > 2 && in[2].defined() && in[2].numel() > 0) value = in[2].reshape({-1})[0].item<double>();
    }
    // Opset 18 `axes` input: pads apply to those axes only.
    std::vector<std::int64_t> axes;
    if (in.size() > 3 && in[3].defined()) {
      at::Tensor a = in[3].to(at::kCPU, at::kLong).contiguous();
      for (std::int64_t i = 0; i < a.numel(); ++i) axes.push_back(normalize_axis(a.data_ptr<std::int64_t>()[i], r, node_));
    } else {
      for (std::int64_t i = 0; i < r; ++i) axes.push_back(i);
    }
    if (pads.size() != 2 * axes.size())
      throw Error(node_.describe() + ": pads has " + std::to_string(pads.size()) + " values, expected " + std::to_string(2 * axes.size()));
    std::vector<std::int64_t> begin(static_cast<std::size_t>(r), 0), end(static_cast<std::size_t>(r), 0);
    for (std::size_t i = 0; i < axes.size(); ++i) {
      begin[static_cast<std::size_t>(axes[i])] = pads[i];
      end[static_cast<std::size_t>(axes[i])] = pads[i + axes.size()];
    }
    if (mode_ == "constant") {
      std::vector<std::int64_t> torch_pads;
      for (std::int64_t d = r; d-- > 0;) {
        torch_pads.push_back(begin[static_cast<std::size_t>(d)]);
        torch_pads.push_back(end[static_cast<std::size_t>(d)]);
      }
      return {at::constant_pad_nd(x, torch_pads, value)};
    }
    // reflect / edge / wrap: gather along each padded axis with computed source indices.
    at::Tensor y = x;
    for (std::int64_t d = 0; d < r; ++d) {
      const std::int64_t b = begin[static_cast<std::size_t>(d)], e = end[static_cast<std::size_t>(d)], n = y.size(d);
      if (b == 0 && e == 0) continue;
      if (n == 0) throw Error(node_.describe() + ": cannot pad an empty axis in mode " + mode_);
      at::Tensor pos = at::arange(-b, n + e, at::TensorOptions().dtype(at::kLong));
      at::Tensor src;
      if (mode_ == "edge") {
        src = pos.clamp(0, n - 1);
      } else if (mode_ == "wrap") {
        src = at::remainder(pos, n);
      } else {
        if (n == 1) src = at::zeros_like(pos);
        else {
          at::Tensor period = at::remainder(pos, 2 * (n - 1));
          src = at::where(period < n, period, 2 * (n - 1) - period);
        }
      }
      y = y.index_select(d, src.to(y.device()));
    }
    return {y};
  }

 private:
  Node node_;
  std::int64_t opset_;
  std::string mode_;
  std::vector<std::int64_t> pads_attr_;
  double value_attr_ = 0.0;
};

void register_all(Registrar& r) {
  r.add_op<QIdentity>("Identity");
  r.add_op<QDropout>("Dropout");
  r.add_op<QFlatten>("Flatten");
  r.add_op<QReshape>("Reshape");
  r.add_op<QConcat>("Concat");
  r.add_op<QPad>("Pad");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.tensor", "0.1.0", sparsebit::ops::register_all)
