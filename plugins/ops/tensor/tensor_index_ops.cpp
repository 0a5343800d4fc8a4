// Indexing ops of the tensor plugin: gathers, scatters and the ops that select or find
// elements (NonZero, OneHot, Compress, Unique). They pass quantization through.

#include <ATen/ATen.h>

#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "tensor_ops.h"

namespace sparsebit::ops {
namespace {

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

}  // namespace

void register_index_ops(Registrar& r) {
  r.add_op<QGather>("Gather");
  r.add_op<QGatherElements>("GatherElements");
  r.add_op<QGatherND>("GatherND");
  r.add_op<QScatterND>("ScatterND");
  r.add_op<QScatterElements>("ScatterElements");
  r.add_op<QScatterElements>("Scatter");  // deprecated alias (opset 9-10)
  r.add_op<QNonZero>("NonZero");
  r.add_op<QOneHot>("OneHot");
  r.add_op<QCompress>("Compress");
  r.add_op<QUnique>("Unique");
}

}  // namespace sparsebit::ops
