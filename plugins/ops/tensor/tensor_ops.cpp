// Data-movement, shape and indexing ops. They pass quantization through (quantizing before or
// after a reshape or a gather is the same), except Identity, which the original toolkit uses
// as an explicit quantization point, and Concat, which quantizes each input.

#include <ATen/ATen.h>

#include <optional>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

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

/// Indices may be negative (counting from the end); anything outside [-n, n) is an error.
at::Tensor checked_indices(const at::Tensor& idx, std::int64_t n, const Node& node) {
  at::Tensor i = idx.to(at::kLong);
  if (i.numel() > 0) {
    const auto lo = i.min().item<std::int64_t>(), hi = i.max().item<std::int64_t>();
    if (lo < -n || hi >= n)
      throw Error(node.describe() + ": index " + std::to_string(lo < -n ? lo : hi) +
                  " is out of range for an axis of " + std::to_string(n));
  }
  return at::where(i < 0, i + n, i);
}

class QGather final : public NodeQModule {
 public:
  explicit QGather(const OpContext& c) : NodeQModule(c), axis_(c.node.attr_int("axis", 0)) {}
  std::vector<InputSpec> input_specs() const override {
    InputSpec table{InputRole::kWeight, axis_};  // an embedding table's rows are what is looked up
    table.lookup_table = true;
    return {table};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    at::Tensor idx = checked_indices(in.at(1), x.size(axis), node()).to(x.device());
    std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().begin() + axis);
    shape.insert(shape.end(), idx.sizes().begin(), idx.sizes().end());
    shape.insert(shape.end(), x.sizes().begin() + axis + 1, x.sizes().end());
    return {x.index_select(axis, idx.reshape({-1})).reshape(shape)};
  }

 private:
  std::int64_t axis_;
};

class QGatherElements final : public NodeQModule {
 public:
  explicit QGatherElements(const OpContext& c) : NodeQModule(c), axis_(c.node.attr_int("axis", 0)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    return {at::gather(x, axis, checked_indices(in.at(1), x.size(axis), node()).to(x.device()))};
  }

 private:
  std::int64_t axis_;
};

class QGatherND final : public NodeQModule {
 public:
  explicit QGatherND(const OpContext& c) : NodeQModule(c), batch_dims_(c.node.attr_int("batch_dims", 0)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor idx = in.at(1).to(at::kLong);
    const std::int64_t b = batch_dims_, k = idx.size(-1);
    if (b < 0 || k < 1 || b + k > x.dim()) throw Error(describe() + ": indices' last dimension does not fit the data");
    // Flatten the batch dims and the k indexed dims into one row index per lookup.
    std::int64_t batch = 1;
    for (std::int64_t d = 0; d < b; ++d) batch *= x.size(d);
    std::vector<std::int64_t> rest(x.sizes().begin() + b + k, x.sizes().end());
    std::vector<std::int64_t> flat_shape{batch, -1};
    flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
    at::Tensor data = x.reshape(flat_shape);
    at::Tensor lin = at::zeros(idx.sizes().slice(0, idx.dim() - 1), idx.options());
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t n = x.size(b + j);
      lin = lin * n + checked_indices(idx.select(-1, j), n, node());
    }
    at::Tensor rows = lin.reshape({batch, -1}).to(x.device());
    std::vector<at::Tensor> per_batch;
    for (std::int64_t i = 0; i < batch; ++i) per_batch.push_back(data[i].index_select(0, rows[i]));
    std::vector<std::int64_t> out(idx.sizes().begin(), idx.sizes().end() - 1);
    out.insert(out.end(), rest.begin(), rest.end());
    return {at::stack(per_batch).reshape(out)};
  }

 private:
  std::int64_t batch_dims_;
};

/// ScatterND and ScatterElements share the reduction attribute.
std::string reduction_of(const Node& n) {
  const std::string r = n.attr_string("reduction", "none");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    throw Error(n.describe() + ": reduction '" + r + "' is not one of none, add, mul, max, min");
  return r;
}
const char* aten_reduce(const std::string& r) {
  return r == "add" ? "sum" : r == "mul" ? "prod" : r == "max" ? "amax" : "amin";
}

class QScatterND final : public NodeQModule {
 public:
  explicit QScatterND(const OpContext& c) : NodeQModule(c), reduction_(reduction_of(c.node)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor idx = in.at(1).to(at::kLong);
    const at::Tensor& upd = in.at(2);
    const std::int64_t k = idx.size(-1);
    if (k < 1 || k > x.dim()) throw Error(describe() + ": indices' last dimension exceeds the data's rank");
    std::vector<std::int64_t> rest(x.sizes().begin() + k, x.sizes().end());
    std::vector<std::int64_t> flat{-1};
    flat.insert(flat.end(), rest.begin(), rest.end());
    at::Tensor lin = at::zeros(idx.sizes().slice(0, idx.dim() - 1), idx.options());
    for (std::int64_t j = 0; j < k; ++j) lin = lin * x.size(j) + checked_indices(idx.select(-1, j), x.size(j), node());
    lin = lin.reshape({-1}).to(x.device());
    at::Tensor u = upd.reshape(flat);
    if (u.size(0) != lin.size(0)) throw Error(describe() + ": updates do not match the indices' shape");
    at::Tensor data = x.reshape(flat);
    if (reduction_ == "none") return {data.index_copy(0, lin, u).reshape(x.sizes())};
    if (reduction_ == "add") return {data.index_add(0, lin, u).reshape(x.sizes())};
    return {data.index_reduce(0, lin, u, aten_reduce(reduction_), /*include_self=*/true).reshape(x.sizes())};
  }

 private:
  std::string reduction_;
};

class QScatterElements final : public NodeQModule {
 public:
  explicit QScatterElements(const OpContext& c)
      : NodeQModule(c), axis_(c.node.attr_int("axis", 0)), reduction_(reduction_of(c.node)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    at::Tensor idx = checked_indices(in.at(1), x.size(axis), node()).to(x.device());
    if (reduction_ == "none") return {at::scatter(x, axis, idx, in.at(2))};
    return {at::scatter_reduce(x, axis, idx, in.at(2), aten_reduce(reduction_), /*include_self=*/true)};
  }

 private:
  std::int64_t axis_;
  std::string reduction_;
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

class QNonZero final : public QModule {
 public:
  explicit QNonZero(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() == 0) return {at::nonzero(x.reshape({1})).t().narrow(0, 0, 0)};
    return {at::nonzero(x).t().contiguous()};
  }
};

class QOneHot final : public NodeQModule {
 public:
  explicit QOneHot(const OpContext& c) : NodeQModule(c), axis_(c.node.attr_int("axis", -1)) {}
  std::vector<InputSpec> input_specs() const override { return reading_on_host({}, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor idx = in.at(0);
    const auto depth = static_cast<std::int64_t>(in.at(1).reshape({-1})[0].item<double>());
    const at::Tensor& values = in.at(2);
    if (depth < 1) throw Error(describe() + ": depth must be positive");
    if (values.numel() != 2) throw Error(describe() + ": values must be [off_value, on_value]");
    const std::int64_t axis = normalize_axis(axis_, idx.dim() + 1, node());
    at::Tensor i = idx.is_floating_point() ? idx.trunc().to(at::kLong) : idx.to(at::kLong);
    i = at::where(i < 0, i + depth, i);  // out-of-range indices match nothing: all off
    at::Tensor hot = i.unsqueeze(-1) == at::arange(depth, i.options());
    at::Tensor v = values.reshape({2});
    return {at::where(hot, v[1], v[0]).movedim(-1, axis)};
  }

 private:
  std::int64_t axis_;
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

// Compress: the slices along `axis` (of the flattened input when absent) whose condition is
// true; a condition shorter than the axis leaves the rest out.
class QCompress final : public NodeQModule {
 public:
  explicit QCompress(const OpContext& c) : NodeQModule(c), has_axis_(c.node.has_attr("axis")) {
    if (has_axis_) axis_ = c.node.attr_int("axis", 0);
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor x = has_axis_ ? in.at(0) : in.at(0).reshape({-1});
    const std::int64_t axis = has_axis_ ? normalize_axis(axis_, x.dim(), node()) : 0;
    at::Tensor cond = in.at(1).reshape({-1}).to(at::kBool);
    if (cond.numel() > x.size(axis))
      throw Error(describe() + ": condition has " + std::to_string(cond.numel()) + " entries for an axis of " +
                  std::to_string(x.size(axis)));
    return {x.index_select(axis, at::nonzero(cond).reshape({-1}).to(x.device()))};
  }

 private:
  bool has_axis_;
  std::int64_t axis_ = 0;
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

// Unique: distinct values (or slices along `axis`), sorted or in order of first occurrence,
// with the index of each one's first occurrence, the inverse mapping and the counts.
class QUnique final : public NodeQModule {
 public:
  explicit QUnique(const OpContext& c)
      : NodeQModule(c), sorted_(c.node.attr_int("sorted", 1) != 0), has_axis_(c.node.has_attr("axis")) {
    if (has_axis_) axis_ = c.node.attr_int("axis", 0);
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor x = has_axis_ ? in.at(0) : in.at(0).reshape({-1});
    const std::int64_t axis = has_axis_ ? normalize_axis(axis_, x.dim(), node()) : 0;
    auto [y, inverse, counts] = at::unique_dim(x, axis, /*sorted=*/true, /*return_inverse=*/true,
                                               /*return_counts=*/true);
    const std::int64_t n = x.size(axis), u = y.size(axis);
    at::Tensor first = at::full({u}, n, inverse.options())
                           .scatter_reduce(0, inverse, at::arange(n, inverse.options()), "amin", /*include_self=*/true);
    if (!sorted_) {  // order of first occurrence
      at::Tensor order = at::argsort(first);
      at::Tensor rank = at::empty_like(order).scatter_(0, order, at::arange(u, order.options()));
      y = y.index_select(axis, order);
      first = first.index_select(0, order);
      counts = counts.index_select(0, order);
      inverse = rank.index_select(0, inverse);
    }
    return {y, first, inverse, counts};
  }

 private:
  bool sorted_, has_axis_;
  std::int64_t axis_ = 0;
};

/// Transpose: the channel axis moves to where `perm` puts it (reversed without `perm`).
class TransposeChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const auto perm = q.node.attr_ints("perm");
    for (std::size_t k = 0; k < perm.size(); ++k)
      if (perm[k] == q.axis) return carried_to_output(static_cast<std::int64_t>(k));
    const std::int64_t rank = tracked_rank(q);
    if (perm.empty() && rank >= 0) return carried_to_output(rank - 1 - q.axis);
    return {};
  }
};

/// Squeeze and Unsqueeze: the channel axis shifts past the axes removed or inserted before it.
class SqueezeChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    const auto* out = q.node.outputs.empty() ? nullptr : q.shape(q.node.outputs[0]);
    if (q.input != 0 || rank < 0 || !out) return {};
    const bool squeeze = q.node.op_type == "Squeeze";
    const std::int64_t out_rank = static_cast<std::int64_t>(out->size());
    const auto axes = axes_of(q, "axes", 1, squeeze ? rank : out_rank);  // Unsqueeze's count in the output
    if (!axes) return {};
    if (squeeze) {
      if (axes->empty() || std::count(axes->begin(), axes->end(), q.axis)) return {};
      return carried_to_output(q.axis -
                               std::count_if(axes->begin(), axes->end(), [&](std::int64_t a) { return a < q.axis; }));
    }
    std::vector<bool> inserted(static_cast<std::size_t>(out_rank), false);
    for (std::int64_t p : *axes) {
      if (p < 0 || p >= out_rank) return {};
      inserted[static_cast<std::size_t>(p)] = true;
    }
    std::int64_t seen = -1;
    for (std::int64_t p = 0; p < out_rank; ++p)
      if (!inserted[static_cast<std::size_t>(p)] && ++seen == q.axis) return carried_to_output(p);
    return {};
  }
};

/// Pad: channels pass when nothing is padded along their axis.
class PadChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0 || q.node.has_input(3)) return {};  // explicit axes: not read here
    std::vector<std::int64_t> pads;
    if (q.node.has_attr("pads")) pads = q.node.attr_ints("pads");
    else if (auto c = q.node.has_input(1) ? q.constant(q.node.inputs[1]) : std::nullopt) pads = int_values(*c);
    if (static_cast<std::int64_t>(pads.size()) != 2 * rank || pads[q.axis] != 0 || pads[q.axis + rank] != 0) return {};
    return carried_to_output(q.axis);
  }
};

/// Slice: channels pass when the channel axis is not sliced.
class SliceChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0) return {};
    std::optional<std::vector<std::int64_t>> axes;
    if (q.node.has_input(3)) {
      axes = axes_of(q, "", 3, rank);
    } else {  // default axes: the first len(starts)
      const auto* starts = q.node.has_input(1) ? q.shape(q.node.inputs[1]) : nullptr;
      if (!starts || starts->size() != 1) return {};
      axes = std::vector<std::int64_t>();
      for (std::int64_t a = 0; a < (*starts)[0]; ++a) axes->push_back(a);
    }
    if (!axes || std::count(axes->begin(), axes->end(), q.axis)) return {};
    return carried_to_output(q.axis);
  }
};

/// Split along another axis: every output carries the channels.
class SplitChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0 || normalized_axis(q.node.attr_int("axis", 0), rank) == q.axis) return {};
    ChannelFlowAnswer a;
    for (std::size_t k = 0; k < q.node.outputs.size(); ++k) a.outputs.push_back({k, q.axis});
    return a;
  }
};

// 10: the mask output became bool (a model reading the old one cannot be lifted); 12: the ratio
// became an input, and an inference-mode Dropout is the identity whatever the ratio.
class DropoutLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {10, 12}; }
  void lift(LiftContext& c, Node& n, std::int64_t version) const override {
    if (version == 10) return drop_outputs(c, n, 1, "(the mask) changes type from the data's to bool at opset 10");
    if (!n.has_attr("ratio")) return;
    n.attributes.erase("ratio");
    c.note(n, "'ratio' attribute removed (inference mode)");
  }
};

// From 11 on pads and the constant value are inputs.
class PadLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {11}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (!n.has_attr("pads")) c.refuse(n, "it has no 'pads' attribute");
    const double value = n.attr_float("value", 0);
    c.attribute_to_input(n, "pads", 1);
    if (!n.has_attr("value")) return;
    n.attributes.erase("value");
    if (value == 0) return;
    c.set_input(n, 2, c.constant(n, "value", at::scalar_tensor(value, float_type_of(c.elem_type(n.inputs.at(0))))));
    c.note(n, "'value' attribute -> input 2");
  }
};

// 13: the sizes became input 1; 18: an equal split needs num_outputs.
class SplitLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {13, 18}; }
  void lift(LiftContext& c, Node& n, std::int64_t version) const override {
    if (version == 13) return c.attribute_to_input(n, "split", 1);
    if (n.has_input(1) || n.has_attr("num_outputs")) return;
    n.attributes["num_outputs"] = Attribute::of_int(static_cast<std::int64_t>(n.outputs.size()));
    c.note(n, "equal split -> num_outputs = " + std::to_string(n.outputs.size()));
  }
};

// From 10 on starts, ends and axes are inputs.
class SliceLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {10}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (!n.has_attr("starts") || !n.has_attr("ends")) c.refuse(n, "it lacks the 'starts' or 'ends' attribute");
    c.attribute_to_input(n, "starts", 1);
    c.attribute_to_input(n, "ends", 2);
    c.attribute_to_input(n, "axes", 3);
  }
};

// Scatter was renamed ScatterElements at 11.
class ScatterLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {11}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    n.op_type = "ScatterElements";
    c.note(n, "Scatter -> ScatterElements");
  }
};

void register_traits(Registrar& r) {
  for (const char* op : {"Identity", "Cast"}) r.add_op_traits<SameMeaning<SameChannels>>(op);
  r.add_op_traits<TraitsOf<SameChannels, DropoutLift>>("Dropout");
  r.add_op_traits<SameMeaning<TransposeChannels>>("Transpose");
  r.add_op_traits<TraitsOf<SqueezeChannels, AxesBecomeInput<13>>>("Squeeze");
  r.add_op_traits<TraitsOf<SqueezeChannels, AxesBecomeInput<13>>>("Unsqueeze");
  r.add_op_traits<TraitsOf<PadChannels, PadLift>>("Pad");
  r.add_op_traits<TraitsOf<SliceChannels, SliceLift>>("Slice");
  r.add_op_traits<TraitsOf<SplitChannels, SplitLift>>("Split");
  r.add_op_traits<ScatterLift>("Scatter");
  for (const char* op : {"Flatten",  "Reshape",   "Concat",          "Gather",          "GatherElements",
                         "GatherND", "ScatterND", "ScatterElements", "Expand",          "Tile",
                         "Shape",    "Size",      "CastLike",        "ConstantOfShape", "Range",
                         "NonZero",  "OneHot",    "Trilu",           "Compress",        "ReverseSequence",
                         "EyeLike",  "Unique",    "Constant",        "DepthToSpace",    "SpaceToDepth"})
    r.add_op_traits<SameMeaning<>>(op);
}

void register_all(Registrar& r) {
  r.add_op<QIdentity>("Identity");
  r.add_op<QDropout>("Dropout");
  r.add_op<QFlatten>("Flatten");
  r.add_op<QReshape>("Reshape");
  r.add_op<QConcat>("Concat");
  r.add_op<QPad>("Pad");
  r.add_op<QSplit>("Split");
  r.add_op<QSlice>("Slice");
  r.add_op<QGather>("Gather");
  r.add_op<QGatherElements>("GatherElements");
  r.add_op<QGatherND>("GatherND");
  r.add_op<QScatterND>("ScatterND");
  r.add_op<QScatterElements>("ScatterElements");
  r.add_op<QScatterElements>("Scatter");  // deprecated alias (opset 9-10)
  r.add_op<QTranspose>("Transpose");
  r.add_op<QSqueeze>("Squeeze");
  r.add_op<QUnsqueeze>("Unsqueeze");
  r.add_op<QExpand>("Expand");
  r.add_op<QTile>("Tile");
  r.add_op<QShape>("Shape");
  r.add_op<QSize>("Size");
  r.add_op<QCast>("Cast");
  r.add_op<QCastLike>("CastLike");
  r.add_op<QConstantOfShape>("ConstantOfShape");
  r.add_op<QRange>("Range");
  r.add_op<QNonZero>("NonZero");
  r.add_op<QOneHot>("OneHot");
  r.add_op<QTrilu>("Trilu");
  r.add_op<QCompress>("Compress");
  r.add_op<QReverseSequence>("ReverseSequence");
  r.add_op<QEyeLike>("EyeLike");
  r.add_op<QUnique>("Unique");
  r.add_op<QConstant>("Constant");
  r.add_op_factory("DepthToSpace", "", [](const OpContext& c) { return std::make_unique<QDepthSpace>(c, true); });
  r.add_op_factory("SpaceToDepth", "", [](const OpContext& c) { return std::make_unique<QDepthSpace>(c, false); });
  register_traits(r);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.tensor", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
