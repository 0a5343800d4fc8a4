// The normalizations of the nn plugin other than BatchNormalization: Instance, Layer and Group
// normalization, LRN, MeanVarianceNormalization. They quantize their input and keep scale and
// bias in float (LRN stays float).

#include <ATen/ATen.h>

#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "nn_ops.h"

namespace sparsebit::ops {
namespace {

/// Reshapes a per-channel vector to broadcast against (N, C, spatial...).
at::Tensor per_channel(const at::Tensor& v, std::int64_t rank) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(rank), 1);
  shape[1] = v.numel();
  return v.reshape(shape);
}

class QInstanceNorm final : public NodeQModule {
 public:
  explicit QInstanceNorm(const OpContext& c) : NodeQModule(c), eps_(c.node.attr_float("epsilon", 1e-5)) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() < 3) throw Error(describe() + ": input must be (N, C, spatial...)");
    if (in.at(1).numel() != x.size(1) || in.at(2).numel() != x.size(1))
      throw Error(describe() + ": scale and B must have one value per channel (" + std::to_string(x.size(1)) + ")");
    std::vector<std::int64_t> dims;
    for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    at::Tensor y = normalize(x, dims, eps_).y;
    return {y * per_channel(in[1], x.dim()) + per_channel(in[2], x.dim())};
  }

 private:
  double eps_;
};

class QLayerNorm final : public NodeQModule {
 public:
  explicit QLayerNorm(const OpContext& c)
      : NodeQModule(c),
        axis_(c.node.attr_int("axis", -1)),
        eps_(c.node.attr_float("epsilon", 1e-5)),
        stash_float_(c.node.attr_int("stash_type", 1) == 1) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    // stash_type 1: statistics in float32 even for half inputs.
    const at::Tensor xs = stash_float_ && x.scalar_type() != at::kDouble ? x.to(at::kFloat) : x;
    const Normalized r = normalize(xs, axes_from(axis_, x.dim(), node()), eps_);
    at::Tensor y = r.y.to(x.scalar_type()) * in.at(1);
    if (in.size() > 2 && in[2].defined()) y = y + in[2];
    return {y, r.mean, r.inv_std};
  }

 private:
  std::int64_t axis_;
  double eps_;
  bool stash_float_;
};

class QGroupNorm final : public NodeQModule {
 public:
  explicit QGroupNorm(const OpContext& c)
      : NodeQModule(c), groups_(c.node.attr_int("num_groups", 0)), eps_(c.node.attr_float("epsilon", 1e-5)) {
    if (groups_ < 1) throw Error(describe() + ": num_groups must be a positive integer");
  }
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() < 2) throw Error(describe() + ": input must be (N, C, ...)");
    const std::int64_t c = x.size(1);
    if (c % groups_)
      throw Error(describe() + ": " + std::to_string(c) + " channels do not divide into " + std::to_string(groups_) +
                  " groups");
    at::Tensor y = normalize(x.reshape({x.size(0), groups_, -1}), {2}, eps_).y.reshape(x.sizes());
    // Opset 18 gives scale and bias per group, opset 21 per channel.
    auto expand = [&](const at::Tensor& v, const char* what) {
      if (v.numel() == c) return per_channel(v, x.dim());
      if (v.numel() == groups_) return per_channel(v.repeat_interleave(c / groups_), x.dim());
      throw Error(describe() + ": " + what + " must have one value per channel or per group");
    };
    return {y * expand(in.at(1), "scale") + expand(in.at(2), "bias")};
  }

 private:
  std::int64_t groups_;
  double eps_;
};

// LRN: each value divided by (bias + alpha / size * sum of squares over the `size` channels
// around it)^beta. Kept float: no backend has an integer kernel for it.
class QLRN final : public NodeQModule {
 public:
  explicit QLRN(const OpContext& c)
      : NodeQModule(c),
        size_(c.node.attr_int("size", 0)),
        alpha_(c.node.attr_float("alpha", 1e-4)),
        beta_(c.node.attr_float("beta", 0.75)),
        bias_(c.node.attr_float("bias", 1.0)) {
    if (size_ < 1) throw Error(describe() + ": size must be a positive integer");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() < 3) throw Error(describe() + ": input must be N x C x D1 ..., got rank " + std::to_string(x.dim()));
    const std::int64_t before = (size_ - 1) / 2, after = size_ - 1 - before;
    // Channel window sums as differences of a cumulative sum over the zero-padded channels.
    at::Tensor sq = x.pow(2).movedim(1, -1);
    at::Tensor padded = at::constant_pad_nd(sq, {before + 1, after}, 0);
    at::Tensor cum = padded.cumsum(-1);
    const std::int64_t c = x.size(1);
    at::Tensor window = cum.narrow(-1, size_, c) - cum.narrow(-1, 0, c);
    return {x / (window.movedim(-1, 1) * (alpha_ / static_cast<double>(size_)) + bias_).pow(beta_)};
  }

 private:
  std::int64_t size_;
  double alpha_, beta_, bias_;
};

// MeanVarianceNormalization: (x - mean) / (std + 1e-9) over `axes` (ONNX's function body).
class QMeanVarianceNorm final : public NodeQModule {
 public:
  explicit QMeanVarianceNorm(const OpContext& c) : NodeQModule(c), axes_(c.node.attr_ints("axes", {0, 2, 3})) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> axes;
    for (auto a : axes_) axes.push_back(normalize_axis(a, x.dim(), node()));
    at::Tensor mean = x.mean(axes, /*keepdim=*/true);
    at::Tensor var = (x * x).mean(axes, /*keepdim=*/true) - mean * mean;
    return {(x - mean) / (at::sqrt(var) + 1e-9)};
  }

 private:
  std::vector<std::int64_t> axes_;
};

}  // namespace

void register_norm_ops(Registrar& r) {
  r.add_op<QInstanceNorm>("InstanceNormalization");
  r.add_op<QLayerNorm>("LayerNormalization");
  r.add_op<QGroupNorm>("GroupNormalization");
  r.add_op<QLRN>("LRN");
  r.add_op<QMeanVarianceNorm>("MeanVarianceNormalization");
}

}  // namespace sparsebit::ops
