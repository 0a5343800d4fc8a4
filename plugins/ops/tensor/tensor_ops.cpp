// The tensor plugin: data-movement, shape, indexing (tensor_index_ops.cpp) and tensor-making
// (tensor_value_ops.cpp) ops, their traits in tensor_traits.cpp. They pass quantization through
// (quantizing before or after a reshape or a gather is the same), except Identity, which the
// original toolkit uses as an explicit quantization point, and Concat, which quantizes each input.

#include <ATen/ATen.h>

#include <optional>

#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "tensor_ops.h"

namespace sparsebit::ops {
namespace {

class QIdentity final : public QModule {
 public:
  explicit QIdentity(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {in.at(0)}; }
};

class QDropout final : public NodeQModule {
 public:
  explicit QDropout(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1, 2}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const bool training = in.size() > 2 && in[2].defined() && in[2].reshape({}).item<bool>();
    const double ratio = in.size() > 1 && in[1].defined() ? in[1].reshape({}).item<double>() : 0.5;
    if (training && ratio > 0) {
      throw Error(describe() +
                  ": Dropout in training mode (random masks) is not supported; export the "
                  "model in eval mode");
    }
    return {x, at::ones(x.sizes(), x.options().dtype(at::kBool))};
  }

 private:
};

class QFlatten final : public NodeQModule {
 public:
  explicit QFlatten(const OpContext& c) : NodeQModule(c), axis_(c.node.attr_int("axis", 1)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::int64_t axis = axis_ < 0 ? axis_ + x.dim() : axis_;
    if (axis < 0 || axis > x.dim()) throw Error(describe() + ": axis out of range");
    std::int64_t outer = 1;
    for (std::int64_t d = 0; d < axis; ++d) outer *= x.size(d);
    std::int64_t inner = 1;
    for (std::int64_t d = axis; d < x.dim(); ++d) inner *= x.size(d);
    return {x.reshape({outer, inner})};
  }

 private:
  std::int64_t axis_;
};

class QReshape final : public NodeQModule {
 public:
  explicit QReshape(const OpContext& c) : NodeQModule(c), allowzero_(c.node.attr_int("allowzero", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor s = in.at(1).to(at::kCPU, at::kLong).contiguous();
    std::vector<std::int64_t> shape(s.data_ptr<std::int64_t>(), s.data_ptr<std::int64_t>() + s.numel());
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 0 && !allowzero_) {
        if (static_cast<std::int64_t>(i) >= x.dim())
          throw Error(describe() + ": shape has 0 at a position the input lacks");
        shape[i] = x.size(static_cast<std::int64_t>(i));
      }
    }
    return {x.reshape(shape)};
  }

 private:
  bool allowzero_;
};

class QConcat final : public NodeQModule {
 public:
  explicit QConcat(const OpContext& c) : NodeQModule(c), axis_(c.node.attr_int("axis", 0)) {
    if (!c.node.has_attr("axis")) throw Error(describe() + ": Concat needs an axis attribute");
  }
  // Every input is quantized (a quantizing identity on each), so that the concatenation of
  // 8-bit tensors stays 8-bit; shape arithmetic on integers is left alone by the host.
  std::vector<InputSpec> input_specs() const override {
    return std::vector<InputSpec>(node().inputs.size(), {InputRole::kActivation, 0});
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    std::vector<at::Tensor> parts;
    for (const auto& t : in)
      if (t.defined()) parts.push_back(t);
    if (parts.empty()) throw Error(describe() + ": no inputs");
    return {at::cat(parts, normalize_axis(axis_, parts[0].dim(), node()))};
  }

 private:
  std::int64_t axis_;
};

class QPad final : public NodeQModule {
 public:
  explicit QPad(const OpContext& c) : NodeQModule(c), opset_(c.opset), mode_(c.node.attr_string("mode", "constant")) {
    if (mode_ != "constant" && mode_ != "reflect" && mode_ != "edge" && mode_ != "wrap")
      throw Error(describe() + ": unknown mode '" + mode_ + "'");
    if (opset_ < 11) {
      pads_attr_ = c.node.attr_ints("pads");
      value_attr_ = c.node.attr_float("value", 0.0);
    }
  }
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1, 2, 3}); }
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
      for (std::int64_t i = 0; i < a.numel(); ++i)
        axes.push_back(normalize_axis(a.data_ptr<std::int64_t>()[i], r, node()));
    } else {
      for (std::int64_t i = 0; i < r; ++i) axes.push_back(i);
    }
    if (pads.size() != 2 * axes.size())
      throw Error(describe() + ": pads has " + std::to_string(pads.size()) + " values, expected " +
                  std::to_string(2 * axes.size()));
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
      if (n == 0) throw Error(describe() + ": cannot pad an empty axis in mode " + mode_);
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
  std::int64_t opset_;
  std::string mode_;
  std::vector<std::int64_t> pads_attr_;
  double value_attr_ = 0.0;
};

class QSplit final : public NodeQModule {
 public:
  explicit QSplit(const OpContext& c)
      : NodeQModule(c),
        axis_(c.node.attr_int("axis", 0)),
        split_attr_(c.node.attr_ints("split")),
        num_outputs_(c.node.attr_int("num_outputs", 0)) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    const std::int64_t n = x.size(axis);
    std::vector<std::int64_t> sizes = split_attr_;
    if (in.size() > 1 && in[1].defined()) sizes = int_list(in[1], node(), "split");
    if (sizes.empty()) {
      // Equal parts; the last one smaller when the axis does not divide (opset 18).
      const std::int64_t parts = num_outputs_ > 0 ? num_outputs_ : static_cast<std::int64_t>(node().outputs.size());
      const std::int64_t chunk = (n + parts - 1) / parts;
      for (std::int64_t i = 0; i < parts; ++i)
        sizes.push_back(std::max<std::int64_t>(0, std::min(chunk, n - i * chunk)));
    }
    std::int64_t total = 0;
    for (auto v : sizes) {
      if (v < 0) throw Error(describe() + ": split sizes must be non-negative");
      total += v;
    }
    if (total != n)
      throw Error(describe() + ": split sizes add up to " + std::to_string(total) + ", axis has " + std::to_string(n));
    return at::split_with_sizes(x, sizes, axis);
  }

 private:
  std::int64_t axis_;
  std::vector<std::int64_t> split_attr_;
  std::int64_t num_outputs_;
};

class QSlice final : public NodeQModule {
 public:
  explicit QSlice(const OpContext& c)
      : NodeQModule(c),
        starts_(c.node.attr_ints("starts")),
        ends_(c.node.attr_ints("ends")),
        axes_(c.node.attr_ints("axes")) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1, 2, 3, 4}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor y = in.at(0);
    std::vector<std::int64_t> starts = starts_, ends = ends_, axes = axes_, steps;
    if (in.size() > 1 && in[1].defined()) starts = int_list(in[1], node(), "starts");
    if (in.size() > 2 && in[2].defined()) ends = int_list(in[2], node(), "ends");
    if (in.size() > 3 && in[3].defined()) axes = int_list(in[3], node(), "axes");
    if (in.size() > 4 && in[4].defined()) steps = int_list(in[4], node(), "steps");
    if (starts.size() != ends.size()) throw Error(describe() + ": starts and ends differ in length");
    if (axes.empty())
      for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (axes.size() != starts.size() || steps.size() != starts.size())
      throw Error(describe() + ": starts, ends, axes and steps must have one value per sliced axis");
    for (std::size_t i = 0; i < starts.size(); ++i) {
      const std::int64_t axis = normalize_axis(axes[i], y.dim(), node()), dim = y.size(axis), step = steps[i];
      if (step == 0) throw Error(describe() + ": a step of 0 is not allowed");
      // The spec's clamping: negative values count from the end, then clamp to the valid range
      // (which depends on the step's sign).
      auto resolve = [&](std::int64_t v, std::int64_t lo, std::int64_t hi) {
        if (v < 0) v = v < -dim ? lo : v + dim;  // avoids overflow of INT64_MIN + dim
        return std::clamp(v, lo, hi);
      };
      if (step > 0) {
        const std::int64_t s = resolve(starts[i], 0, dim), e = resolve(ends[i], 0, dim);
        y = e > s ? y.slice(axis, s, e, step) : y.narrow(axis, 0, 0);
      } else {
        const std::int64_t s = resolve(starts[i], -1, dim - 1), e = resolve(ends[i], -1, dim - 1);
        // Negative steps walk backwards; ATen slices only forwards, so gather the indices.
        if (s > e) {
          at::Tensor idx = at::arange(s, e, step, at::TensorOptions().dtype(at::kLong).device(y.device()));
          y = y.index_select(axis, idx);
        } else {
          y = y.narrow(axis, 0, 0);
        }
      }
    }
    return {y};
  }

 private:
  std::vector<std::int64_t> starts_, ends_, axes_;
};

class QTranspose final : public NodeQModule {
 public:
  explicit QTranspose(const OpContext& c) : NodeQModule(c), perm_(c.node.attr_ints("perm")) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> perm = perm_;
    if (perm.empty())
      for (std::int64_t d = x.dim(); d-- > 0;) perm.push_back(d);
    if (static_cast<std::int64_t>(perm.size()) != x.dim())
      throw Error(describe() + ": perm has " + std::to_string(perm.size()) + " entries for rank " +
                  std::to_string(x.dim()));
    return {x.permute(perm)};
  }

 private:
  std::vector<std::int64_t> perm_;
};

class QSqueeze final : public NodeQModule {
 public:
  explicit QSqueeze(const OpContext& c) : NodeQModule(c), axes_(c.node.attr_ints("axes")) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> axes = axes_;
    if (in.size() > 1 && in[1].defined()) axes = int_list(in[1], node(), "axes");
    std::vector<std::int64_t> shape;
    std::vector<bool> drop(static_cast<std::size_t>(x.dim()), axes.empty());
    for (auto a : axes) {
      const std::int64_t d = normalize_axis(a, x.dim(), node());
      if (x.size(d) != 1)
        throw Error(describe() + ": cannot squeeze axis " + std::to_string(a) + " of size " +
                    std::to_string(x.size(d)));
      drop[static_cast<std::size_t>(d)] = true;
    }
    for (std::int64_t d = 0; d < x.dim(); ++d)
      if (!drop[static_cast<std::size_t>(d)] || x.size(d) != 1) shape.push_back(x.size(d));
    return {x.reshape(shape)};
  }

 private:
  std::vector<std::int64_t> axes_;
};

class QUnsqueeze final : public NodeQModule {
 public:
  explicit QUnsqueeze(const OpContext& c) : NodeQModule(c), axes_(c.node.attr_ints("axes")) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> axes = axes_;
    if (in.size() > 1 && in[1].defined()) axes = int_list(in[1], node(), "axes");
    const std::int64_t rank = x.dim() + static_cast<std::int64_t>(axes.size());
    std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
    for (auto a : axes) {
      const std::int64_t d = normalize_axis(a, rank, node());
      if (inserted[static_cast<std::size_t>(d)]) throw Error(describe() + ": axes repeat an axis");
      inserted[static_cast<std::size_t>(d)] = true;
    }
    std::vector<std::int64_t> shape;
    std::int64_t src = 0;
    for (std::int64_t d = 0; d < rank; ++d) shape.push_back(inserted[static_cast<std::size_t>(d)] ? 1 : x.size(src++));
    return {x.reshape(shape)};
  }

 private:
  std::vector<std::int64_t> axes_;
};

class QExpand final : public NodeQModule {
 public:
  explicit QExpand(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    // Bidirectional broadcast: a 1 in `shape` keeps the input's size.
    const auto target = at::infer_size(x.sizes(), int_list(in.at(1), node(), "shape"));
    return {x.expand(target).contiguous()};
  }

 private:
};

class QTile final : public NodeQModule {
 public:
  explicit QTile(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    auto repeats = int_list(in.at(1), node(), "repeats");
    if (static_cast<std::int64_t>(repeats.size()) != x.dim())
      throw Error(describe() + ": repeats has " + std::to_string(repeats.size()) + " values for rank " +
                  std::to_string(x.dim()));
    for (auto v : repeats)
      if (v < 0) throw Error(describe() + ": repeats must be non-negative");
    return {x.repeat(repeats)};
  }

 private:
};

/// DepthToSpace (DCR or CRD order) and SpaceToDepth on NCHW tensors.
class QDepthSpace final : public NodeQModule {
 public:
  QDepthSpace(const OpContext& c, bool to_space)
      : NodeQModule(c),
        to_space_(to_space),
        b_(c.node.attr_int("blocksize", 0)),
        mode_(c.node.attr_string("mode", "DCR")) {
    if (b_ < 1) throw Error(describe() + ": blocksize must be a positive integer");
    if (mode_ != "DCR" && mode_ != "CRD") throw Error(describe() + ": mode must be DCR or CRD");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() != 4) throw Error(describe() + ": input must be 4-D (N, C, H, W)");
    const std::int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), b = b_;
    if (to_space_) {
      if (c % (b * b)) throw Error(describe() + ": channels must divide by blocksize^2");
      if (mode_ == "DCR")
        return {x.reshape({n, b, b, c / (b * b), h, w})
                    .permute({0, 3, 4, 1, 5, 2})
                    .reshape({n, c / (b * b), h * b, w * b})};
      return {
          x.reshape({n, c / (b * b), b, b, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({n, c / (b * b), h * b, w * b})};
    }
    if (h % b || w % b) throw Error(describe() + ": height and width must divide by blocksize");
    return {x.reshape({n, c, h / b, b, w / b, b}).permute({0, 3, 5, 1, 2, 4}).reshape({n, c * b * b, h / b, w / b})};
  }

 private:
  bool to_space_;
  std::int64_t b_;
  std::string mode_;
};

// ReverseSequence: reverses the first sequence_lens[b] steps along time_axis of each batch
// entry b (batch_axis), leaving the steps past its length in place.
class QReverseSequence final : public NodeQModule {
 public:
  explicit QReverseSequence(const OpContext& c)
      : NodeQModule(c), batch_axis_(c.node.attr_int("batch_axis", 1)), time_axis_(c.node.attr_int("time_axis", 0)) {
    if (!((batch_axis_ == 0 && time_axis_ == 1) || (batch_axis_ == 1 && time_axis_ == 0)))
      throw Error(describe() + ": batch_axis and time_axis must be 0 and 1 (in either order)");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() < 2) throw Error(describe() + ": input must have rank 2 or more");
    const std::int64_t steps = x.size(time_axis_), batch = x.size(batch_axis_);
    at::Tensor lens = in.at(1).to(at::kCPU, at::kLong).reshape({-1});
    if (lens.numel() != batch)
      throw Error(describe() + ": sequence_lens has " + std::to_string(lens.numel()) + " entries for a batch of " +
                  std::to_string(batch));
    if ((lens < 0).any().item<bool>() || (lens > steps).any().item<bool>())
      throw Error(describe() + ": sequence_lens must lie in 0.." + std::to_string(steps));
    at::Tensor t = at::arange(steps, at::kLong).unsqueeze(1);  // [time, batch]
    at::Tensor index = at::where(t < lens, lens - 1 - t, t);
    if (batch_axis_ == 0) index = index.t();
    std::vector<std::int64_t> shape(index.sizes().begin(), index.sizes().end());
    shape.resize(static_cast<std::size_t>(x.dim()), 1);
    return {at::take_along_dim(x, index.reshape(shape).to(x.device()).expand(x.sizes()), time_axis_)};
  }

 private:
  std::int64_t batch_axis_, time_axis_;
};

void register_all(Registrar& r) {
  r.add_op<QIdentity>("Identity");
  r.add_op<QDropout>("Dropout");
  r.add_op<QFlatten>("Flatten");
  r.add_op<QReshape>("Reshape");
  r.add_op<QConcat>("Concat");
  r.add_op<QPad>("Pad");
  r.add_op<QSplit>("Split");
  r.add_op<QSlice>("Slice");
  r.add_op<QTranspose>("Transpose");
  r.add_op<QSqueeze>("Squeeze");
  r.add_op<QUnsqueeze>("Unsqueeze");
  r.add_op<QExpand>("Expand");
  r.add_op<QTile>("Tile");
  r.add_op<QReverseSequence>("ReverseSequence");
  r.add_op_factory("DepthToSpace", "", [](const OpContext& c) { return std::make_unique<QDepthSpace>(c, true); });
  r.add_op_factory("SpaceToDepth", "", [](const OpContext& c) { return std::make_unique<QDepthSpace>(c, false); });
  register_index_ops(r);
  register_value_ops(r);
  register_traits(r);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.tensor", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
