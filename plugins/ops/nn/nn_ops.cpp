// Ops with weights, the pooling family and the normalizations: Conv, ConvTranspose, Gemm,
// MatMul, BatchNormalization, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool,
// InstanceNormalization, LayerNormalization, GroupNormalization.
//
// Quantization roles follow the original toolkit: Conv/Gemm/MatMul quantize their input
// activation and their weight (per channel along the output-channel axis); average pooling
// quantizes its input; MaxPool commutes with quantization and passes through; BN is kept in
// float (it is folded into the conv by the exporter or by fuse_bn); the other norms quantize
// their input and keep scale and bias in float.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/data_parallel.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

class QConv final : public NodeQModule {
 public:
  explicit QConv(const OpContext& c) : NodeQModule(c), win_(c.node), group_(c.node.attr_int("group", 1)) {
    if (group_ < 1) throw Error(describe() + ": group must be >= 1");
  }
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, 0}, {InputRole::kBias, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor b = in.size() > 2 ? in[2] : at::Tensor();
    return {onnx_conv(in.at(0), in.at(1), b, win_, group_, node())};
  }

 private:
  Window win_;
  std::int64_t group_;
};

// ConvTranspose: W is [C_in, C_out / group, k...], so its output channels are axis 1 (the
// original toolkit quantized axis 0, a bug). Pads (explicit, from output_shape or auto_pad) and
// output_padding are applied by cropping / zero-extending the full transposed convolution,
// which handles asymmetric cases that ATen's symmetric padding cannot.
class QConvTranspose final : public NodeQModule {
 public:
  explicit QConvTranspose(const OpContext& c)
      : NodeQModule(c),
        win_(c.node),
        group_(c.node.attr_int("group", 1)),
        output_padding_(c.node.attr_ints("output_padding")),
        output_shape_(c.node.attr_ints("output_shape")) {
    if (group_ < 1) throw Error(describe() + ": group must be >= 1");
  }
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, 1}, {InputRole::kBias, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& w = in.at(1);
    if (x.dim() < 3 || w.dim() != x.dim())
      throw Error(describe() + ": input of rank " + std::to_string(x.dim()) + " and weight of rank " +
                  std::to_string(w.dim()) + " do not fit (expected N,C,spatial... and C,M/group,k...)");
    const std::size_t r = static_cast<std::size_t>(x.dim() - 2);
    std::vector<std::int64_t> k(w.sizes().begin() + 2, w.sizes().end());
    std::vector<std::int64_t> strides = win_.strides.empty() ? std::vector<std::int64_t>(r, 1) : win_.strides;
    std::vector<std::int64_t> dil = win_.dilations.empty() ? std::vector<std::int64_t>(r, 1) : win_.dilations;
    std::vector<std::int64_t> opad = output_padding_.empty() ? std::vector<std::int64_t>(r, 0) : output_padding_;
    std::vector<std::int64_t> pads = win_.pads.empty() ? std::vector<std::int64_t>(2 * r, 0) : win_.pads;
    at::Tensor full = at::convolution(x, w, {}, strides, std::vector<std::int64_t>(r, 0), dil, true,
                                      std::vector<std::int64_t>(r, 0), group_);
    std::vector<std::int64_t> in_sp = spatial_sizes(x);
    const bool same = win_.auto_pad == "SAME_UPPER" || win_.auto_pad == "SAME_LOWER";
    if (!output_shape_.empty() || same) {
      // Pads follow from the requested output size (the spec's total_padding rule).
      std::vector<std::int64_t> target = output_shape_;
      if (target.size() > r) target.erase(target.begin(), target.end() - static_cast<long>(r));
      for (std::size_t i = 0; i < r; ++i) {
        const std::int64_t out = target.empty() ? in_sp[i] * strides[i] : target[i];
        const std::int64_t total = strides[i] * (in_sp[i] - 1) + opad[i] + (k[i] - 1) * dil[i] + 1 - out;
        const std::int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor division
        const bool upper = win_.auto_pad == "SAME_UPPER";
        pads[i] = upper ? half : total - half;
        pads[i + r] = upper ? total - half : half;
      }
    } else if (win_.auto_pad == "VALID") {
      pads.assign(2 * r, 0);
    }
    // Crop the pads (a negative pad extends with zeros) and append output_padding, per dim;
    // constant_pad_nd takes [last-dim begin, last-dim end, ...], negative values crop.
    std::vector<std::int64_t> pad_spec;
    for (std::size_t i = r; i-- > 0;) {
      const std::int64_t length = full.size(static_cast<std::int64_t>(i + 2)) - pads[i] - pads[i + r] + opad[i];
      if (length < 0) throw Error(describe() + ": pads and output_padding give a negative output size");
      pad_spec.push_back(-pads[i]);
      pad_spec.push_back(opad[i] - pads[i + r]);
    }
    at::Tensor y = at::constant_pad_nd(full, pad_spec, 0.0);
    if (in.size() > 2 && in[2].defined()) {
      std::vector<std::int64_t> shape(static_cast<std::size_t>(y.dim()), 1);
      shape[1] = in[2].numel();
      y = y + in[2].reshape(shape);
    }
    return {y};
  }

 private:
  Window win_;
  std::int64_t group_;
  std::vector<std::int64_t> output_padding_, output_shape_;
};

class QGemm final : public NodeQModule {
 public:
  explicit QGemm(const OpContext& c)
      : NodeQModule(c),
        alpha_(c.node.attr_float("alpha", 1.0)),
        beta_(c.node.attr_float("beta", 1.0)),
        trans_a_(c.node.attr_int("transA", 0) != 0),
        trans_b_(c.node.attr_int("transB", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override {
    // Output channels of B are its columns, or its rows when transposed.
    // C is a bias of A*B only without alpha/beta scaling.
    const InputRole c_role = alpha_ == 1.0 && beta_ == 1.0 ? InputRole::kBias : InputRole::kFloat;
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, trans_b_ ? 0 : 1}, {c_role, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor a = trans_a_ ? in.at(0).t() : in.at(0);
    at::Tensor b = trans_b_ ? in.at(1).t() : in.at(1);
    if (a.dim() != 2 || b.dim() != 2) throw Error(describe() + ": Gemm takes 2-D A and B");
    at::Tensor y = at::matmul(a, b);
    if (alpha_ != 1.0) y = y * alpha_;
    if (in.size() > 2 && in[2].defined()) y = beta_ == 1.0 ? y + in[2] : y + in[2] * beta_;
    return {y};
  }

 private:
  double alpha_, beta_;
  bool trans_a_, trans_b_;
};

class QMatMul final : public QModule {
 public:
  explicit QMatMul(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override {
    // A constant B is a weight whose output channels are its last axis; a computed B is
    // quantized as an activation by the host.
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, -1}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {at::matmul(in.at(0), in.at(1))};
  }
};

class QBatchNorm final : public NodeQModule {
 public:
  explicit QBatchNorm(const OpContext& c)
      : NodeQModule(c),
        eps_(c.node.attr_float("epsilon", 1e-5)),
        momentum_(c.node.attr_float("momentum", 0.9)),
        training_(c.node.attr_int("training_mode", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override {
    std::vector<InputSpec> specs(5);  // X stays float: conv -> BN runs as one kernel
    specs[1].trainable = specs[2].trainable = true;
    specs[3].training_state = specs[4].training_state = true;
    return specs;
  }
  void set_training(bool on) override { qat_training_ = on; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor &scale = in.at(1), &bias = in.at(2), &mean = in.at(3), &var = in.at(4);
    // QAT (QuantModel::train): batch statistics, running ones updated in place, as PyTorch does
    // (ONNX momentum m keeps m of the old value).
    if (qat_training_ && !training_) {
      if (sdk::training_processes() > 1) return {synchronized(x, scale, bias, mean, var)};
      return {at::batch_norm(x, scale, bias, mean, var, true, 1.0 - momentum_, eps_, false)};
    }
    if (!training_) return {at::batch_norm(x, scale, bias, mean, var, false, 0.0, eps_, false)};
    // Training mode: normalize with batch statistics and update the running ones (population
    // variance, as the ONNX reference does).
    std::vector<std::int64_t> dims{0};
    for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    at::Tensor bmean = x.mean(dims);
    at::Tensor bvar = x.var(dims, /*unbiased=*/false);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
    shape[1] = x.size(1);
    at::Tensor y =
        (x - bmean.reshape(shape)) / at::sqrt(bvar.reshape(shape) + eps_) * scale.reshape(shape) + bias.reshape(shape);
    return {y, mean * momentum_ + bmean * (1 - momentum_), var * momentum_ + bvar * (1 - momentum_)};
  }

 private:
  // QAT over several processes, each with a slice of the batch: the statistics of the whole
  // batch (Note [Batch statistics over processes]), so a step equals one process's. The
  // variance sums squares around the global mean (a second sum), not E[x^2] - E[x]^2.
  at::Tensor synchronized(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias, const at::Tensor& mean,
                          const at::Tensor& var) const {
    std::vector<std::int64_t> dims{0};
    for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
    shape[1] = x.size(1);
    const std::int64_t channels = x.size(1);
    const double local = x.size(1) ? double(x.numel() / x.size(1)) : 0.0;
    const at::Tensor sums = sdk::sum_over_processes(at::cat({x.sum(dims), at::full({1}, local, x.options())}));
    const at::Tensor count = sums.narrow(0, channels, 1).detach();  // a tensor: no wait for the device
    const at::Tensor bmean = sums.narrow(0, 0, channels) / count;
    const at::Tensor centered = x - bmean.reshape(shape);
    const at::Tensor bvar = sdk::sum_over_processes(centered.pow(2).sum(dims)) / count;
    {
      // Running statistics as at::batch_norm keeps them: the unbiased variance.
      c10::NoGradGuard no_grad;
      mean.mul_(momentum_).add_(bmean.detach() * (1 - momentum_));
      var.mul_(momentum_).add_(bvar.detach() * (count / (count - 1).clamp_min(1)) * (1 - momentum_));
    }
    return centered * at::rsqrt(bvar.reshape(shape) + eps_) * scale.reshape(shape) + bias.reshape(shape);
  }

  double eps_, momentum_;
  bool training_;  // the node's own training_mode: ONNX training semantics, running stats as outputs
  bool qat_training_ = false;
};

class QMaxPool final : public NodeQModule {
 public:
  explicit QMaxPool(const OpContext& c)
      : NodeQModule(c), win_(c.node), storage_order_(c.node.attr_int("storage_order", 0)) {
    if (win_.kernel.empty()) throw Error(describe() + ": kernel_shape is required");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::size_t r = win_.kernel.size();
    if (x.dim() != static_cast<std::int64_t>(r) + 2)
      throw Error(describe() + ": input rank " + std::to_string(x.dim()) + " does not fit kernel_shape of " +
                  std::to_string(r) + " dims");
    Window win = win_;
    auto pads = win.resolve(spatial_sizes(x), win.kernel);
    at::Tensor input = x;
    std::vector<std::int64_t> padding(r, 0);
    bool prepadded = false;
    bool fits = symmetric(pads);
    for (std::size_t i = 0; i < r && fits; ++i) fits = pads[i] * 2 <= win.kernel[i];
    if (fits) {
      padding.assign(pads.begin(), pads.begin() + static_cast<long>(r));
    } else {
      input = pad_spatial(x, pads, -std::numeric_limits<double>::infinity());
      prepadded = true;
    }
    // ATen pools floating point only; the max of integers is exact in float for 8/16-bit types.
    const at::ScalarType dtype = input.scalar_type();
    if (!input.is_floating_point()) input = input.to(at::kFloat);
    std::tuple<at::Tensor, at::Tensor> res;
    if (r == 1)
      res = at::max_pool1d_with_indices(input, win.kernel, win.strides, padding, win.dilations, win.ceil_mode);
    else if (r == 2)
      res = at::max_pool2d_with_indices(input, win.kernel, win.strides, padding, win.dilations, win.ceil_mode);
    else if (r == 3)
      res = at::max_pool3d_with_indices(input, win.kernel, win.strides, padding, win.dilations, win.ceil_mode);
    else throw Error(describe() + ": MaxPool supports 1-3 spatial dims");
    at::Tensor y = std::get<0>(res).to(dtype);
    if (node().outputs.size() < 2 || node().outputs[1].empty()) return {y};
    if (prepadded) throw Error(describe() + ": the Indices output with asymmetric or large pads is not supported");
    return {y, onnx_indices(std::get<1>(res), x)};
  }

 private:
  // ATen indexes within one (n, c) plane in row-major order; ONNX indexes the whole tensor, in
  // row- or column-major order of the spatial dims.
  at::Tensor onnx_indices(const at::Tensor& plane_idx, const at::Tensor& x) const {
    const std::int64_t n = x.size(0), c = x.size(1);
    std::vector<std::int64_t> sp = spatial_sizes(x);
    std::int64_t plane = 1;
    for (auto s : sp) plane *= s;
    at::Tensor idx = plane_idx;
    if (storage_order_ == 1 && sp.size() == 2) {
      at::Tensor h = at::floor_divide(idx, sp[1]), w = at::remainder(idx, sp[1]);
      idx = w * sp[0] + h;
    }
    std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
    shape[0] = n;
    shape[1] = c;
    at::Tensor base = at::arange(n * c, idx.options()).reshape(shape) * plane;
    return idx + base;
  }

  Window win_;
  std::int64_t storage_order_;
};

class QAveragePool final : public NodeQModule {
 public:
  explicit QAveragePool(const OpContext& c)
      : NodeQModule(c), win_(c.node), count_include_pad_(c.node.attr_int("count_include_pad", 0) != 0) {
    if (win_.kernel.empty()) throw Error(describe() + ": kernel_shape is required");
  }
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::size_t r = win_.kernel.size();
    if (x.dim() != static_cast<std::int64_t>(r) + 2 || r > 3)
      throw Error(describe() + ": input rank " + std::to_string(x.dim()) + " does not fit kernel_shape of " +
                  std::to_string(r) + " dims");
    Window win = win_;
    for (auto d : win.dilations)
      if (d != 1) throw Error(describe() + ": dilated AveragePool is not supported");
    auto pads = win.resolve(spatial_sizes(x), win.kernel);
    // Pad explicitly, then average only over real (count_include_pad=0) or real+padded
    // (count_include_pad=1) positions; positions past the padded input (ceil_mode) never count.
    at::Tensor xp = pad_spatial(x, pads, 0.0);
    at::Tensor sum = window_sum(xp, win);
    std::vector<std::int64_t> sp_shape{1, 1};
    for (auto s : spatial_sizes(x)) sp_shape.push_back(s);
    at::Tensor mask = count_include_pad_ ? at::ones(spatial_with_pads(sp_shape, pads), x.options())
                                         : pad_spatial(at::ones(sp_shape, x.options()), pads, 0.0);
    at::Tensor count = window_sum(mask, win);
    return {sum / count};
  }

 private:
  static std::vector<std::int64_t> spatial_with_pads(std::vector<std::int64_t> shape,
                                                     const std::vector<std::int64_t>& pads) {
    const std::size_t r = pads.size() / 2;
    for (std::size_t i = 0; i < r; ++i) shape[i + 2] += pads[i] + pads[i + r];
    return shape;
  }
  // Sum over each window (divisor 1) of the already padded input.
  static at::Tensor window_sum(const at::Tensor& x, const Window& win) {
    const std::size_t r = win.kernel.size();
    std::vector<std::int64_t> zero(r, 0);
    if (r == 1) {
      return at::avg_pool2d(x.unsqueeze(-1), {win.kernel[0], 1}, {win.strides[0], 1}, {0, 0}, win.ceil_mode, true, 1)
          .squeeze(-1);
    }
    if (r == 2) return at::avg_pool2d(x, win.kernel, win.strides, zero, win.ceil_mode, true, 1);
    return at::avg_pool3d(x, win.kernel, win.strides, zero, win.ceil_mode, true, 1);
  }

  Window win_;
  bool count_include_pad_;
};

class QGlobalAveragePool final : public QModule {
 public:
  explicit QGlobalAveragePool(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> dims;
    for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    return {x.mean(dims, /*keepdim=*/true)};
  }
};

class QGlobalMaxPool final : public QModule {
 public:
  explicit QGlobalMaxPool(const OpContext&) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<std::int64_t> dims;
    for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    return {at::amax(x, dims, /*keepdim=*/true)};
  }
};

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

std::int64_t product(const std::vector<std::int64_t>& s, std::size_t from = 0) {
  std::int64_t p = 1;
  for (std::size_t i = from; i < s.size(); ++i) p *= s[i];
  return p;
}

/// What ONNX Runtime refuses at session creation: attributes that disagree with the weight.
void check_conv(const Node& n, const Graph& g, bool transpose) {
  if (!n.has_input(1)) return;
  auto w = g.initializers.find(n.inputs[1]);
  if (w == g.initializers.end()) return;
  const at::Tensor& weight = w->second;
  auto bad = [&](const std::string& why) {
    throw Error(n.describe() + ": " + why + " (weight '" + printable(n.inputs[1]) + "' has shape " +
                c10::str(weight.sizes()) + "); fix or re-export the model");
  };
  if (weight.dim() < 3) bad("the weight needs at least 3 dimensions");
  const auto spatial = static_cast<std::size_t>(weight.dim() - 2);
  const std::vector<std::int64_t> kernel(weight.sizes().begin() + 2, weight.sizes().end());
  if (n.has_attr("kernel_shape") && n.attr_ints("kernel_shape") != kernel)
    bad("kernel_shape " + c10::str(c10::IntArrayRef(n.attr_ints("kernel_shape"))) +
        " disagrees with the weight's spatial dims");
  for (const char* key : {"strides", "dilations"}) {
    const auto v = n.attr_ints(key);
    if (n.has_attr(key) && v.size() != spatial)
      bad(std::string(key) + " has " + std::to_string(v.size()) + " values for " + std::to_string(spatial) +
          " spatial dims");
    for (auto x : v)
      if (x < 1) bad(std::string(key) + " must be at least 1");
  }
  if (n.has_attr("pads") && n.attr_ints("pads").size() != 2 * spatial)
    bad("pads has " + std::to_string(n.attr_ints("pads").size()) + " values for " + std::to_string(spatial) +
        " spatial dims");
  const std::int64_t group = n.attr_int("group", 1);
  if (group < 1) bad("group must be at least 1");
  if (!transpose && weight.size(0) % group != 0)
    bad("group " + std::to_string(group) + " does not divide the " + std::to_string(weight.size(0)) +
        " output channels");
}

/// For a 2-D Conv, the sum over the batch of the mean over output positions of the input under
/// each kernel tap, zero padding included: [C, kh * kw]. What a removed weight w[o, c, tap] took
/// away from output o on average is w times that mean, exactly, also near the borders.
/// Undefined for other convs (auto_pad SAME, 1-D, 3-D): they use the channel mean.
at::Tensor conv_tap_sums(const Node& n, const at::Tensor& x) {
  if (x.dim() != 4 || n.attr_string("auto_pad", "NOTSET") != "NOTSET") return {};
  auto kernel = n.attr_ints("kernel_shape");
  if (kernel.size() != 2) return {};
  auto pads = n.attr_ints("pads", {0, 0, 0, 0});
  auto strides = n.attr_ints("strides", {1, 1}), dilations = n.attr_ints("dilations", {1, 1});
  if (pads.size() != 4 || strides.size() != 2 || dilations.size() != 2) return {};
  const at::Tensor padded = at::constant_pad_nd(x.to(at::kDouble), {pads[1], pads[3], pads[0], pads[2]});
  const at::Tensor cols = at::im2col(padded, kernel, dilations, {0, 0}, strides);  // [N, C * taps, L]
  return cols.mean(2).sum(0).view({x.size(1), kernel[0] * kernel[1]});
}

/// Conv's bias compensation: the change of each output's mean, from per-tap input means
/// ([C, taps], conv_tap_sums) or per-channel ones ([C]).
at::Tensor conv_bias_shift(const Node& n, const at::Tensor& d, const at::Tensor& mu) {
  const std::int64_t groups = n.attr_int("group", 1), out = d.size(0), per_group = d.size(1);
  if (mu.size(0) != groups * per_group || out % groups) return {};
  const std::int64_t taps = d.numel() / (out * per_group);
  if (mu.dim() == 2 && mu.size(1) == taps) {
    const at::Tensor m = mu.view({groups, per_group * taps}).repeat_interleave(out / groups, 0);
    return (d.reshape({out, per_group * taps}) * m).sum(1);
  }
  if (mu.dim() != 1) return {};
  const at::Tensor m = mu.view({groups, per_group}).repeat_interleave(out / groups, 0);
  return (d.flatten(2).sum(2) * m).sum(1);
}

/// Conv: weight [out, in / group, k...]; each output element sums in / group x k... products.
/// ConvTranspose: weight [in, out / group, k...]; each input element feeds out / group x k...
template <bool Transpose>
class ConvLayer : public WeightedLayer, public ChecksAtImport {
 public:
  void check(const Node& n, const Graph& g) const override { check_conv(n, g, Transpose); }
  ActivationSums activation_sums(const Node& n, const at::Tensor& x, std::int64_t weight_rank) const override {
    if (!Transpose)
      if (at::Tensor taps = conv_tap_sums(n, x); taps.defined()) return {taps, static_cast<double>(x.size(0))};
    return WeightedLayer::activation_sums(n, x, weight_rank);
  }
  at::Tensor bias_shift(const Node& n, const at::Tensor& delta, const at::Tensor& mean) const override {
    return Transpose || delta.dim() < 3 ? at::Tensor() : conv_bias_shift(n, delta, mean);
  }
  std::optional<LayerAxes> axes(const Node&, std::int64_t weight_rank) const override {
    if (weight_rank < 3) return std::nullopt;
    return Transpose ? LayerAxes{1, 0, 1} : LayerAxes{0, 1, 1};
  }
  std::int64_t groups(const Node& n) const override { return n.attr_int("group", 1); }
  std::optional<std::size_t> bias_input(const Node&) const override { return 2; }
  std::int64_t macs(const Node&, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w,
                    const std::vector<std::int64_t>* y) const override {
    if (Transpose) return product(x) * product(w, 1);
    return y ? product(*y) * product(w, 1) : 0;
  }
  // ONNX Runtime runs a quantized ConvTranspose in float; a Conv reads its weight channels last.
  at::Tensor reduction_rows(const Node& n, const at::Tensor& w) const override {
    return Transpose || w.dim() < 3 ? at::Tensor() : WeightedLayer::reduction_rows(n, w);
  }
};
/// Gemm: A [M, K] (transA: [K, M]) times B [K, N] (transB: [N, K]).
class GemmLayer : public WeightedLayer {
 public:
  std::optional<LayerAxes> axes(const Node& n, std::int64_t weight_rank) const override {
    if (weight_rank != 2) return std::nullopt;
    LayerAxes a = n.attr_int("transB", 0) ? LayerAxes{0, 1, 1} : LayerAxes{1, 0, 1};
    if (n.attr_int("transA", 0)) {  // A [K, M]: features along axis 0, the output still [M, N]
      a.activation = 0;
      a.output = 1;
    }
    return a;
  }
  std::optional<std::size_t> bias_input(const Node&) const override { return 2; }
  double bias_factor(const Node& n) const override { return n.attr_float("beta", 1.0); }
  // C gains alpha / beta of the product's change (a transposed A's features are not on C's axis).
  at::Tensor bias_shift(const Node& n, const at::Tensor& delta, const at::Tensor& mean) const override {
    if (n.attr_int("transA", 0) != 0 || delta.dim() != 2) return {};
    const double beta = n.attr_float("beta", 1.0), alpha = n.attr_float("alpha", 1.0);
    const at::Tensor dw = n.attr_int("transB", 0) ? delta : delta.t();
    if (beta == 0 || mean.dim() != 1 || mean.numel() != dw.size(1)) return {};
    return dw.matmul(mean) * (alpha / beta);
  }
  std::int64_t macs(const Node& n, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>&,
                    const std::vector<std::int64_t>* y) const override {
    if (!y || x.size() != 2) return 0;
    return product(*y) * x[n.attr_int("transA", 0) ? 0 : 1];
  }
  at::Tensor reduction_rows(const Node& n, const at::Tensor& w) const override {  // whatever transA is
    if (w.dim() != 2) return {};
    return n.attr_int("transB", 0) ? w : w.t();
  }
};

/// MatMul: [..., M, K] times a weight [K, N]: the activation's channels are its last axis.
class MatMulLayer : public WeightedLayer {
 public:
  std::optional<LayerAxes> axes(const Node&, std::int64_t weight_rank) const override {
    if (weight_rank != 2) return std::nullopt;  // a batch of weights is not one layer's
    return LayerAxes{1, 0, -1};
  }
  std::int64_t macs(const Node&, const std::vector<std::int64_t>& x, const std::vector<std::int64_t>&,
                    const std::vector<std::int64_t>* y) const override {
    return y && !x.empty() ? product(*y) * x.back() : 0;
  }
  at::Tensor reduction_rows(const Node&, const at::Tensor& w) const override {  // along K of [..., K, N]
    if (w.dim() < 2) return {};
    return w.transpose(-1, -2).reshape({-1, w.size(-2)});
  }
};

/// BatchNormalization: scale, B, mean and var in inputs 1 to 4.
class BatchNormStatistics : public RunningStatistics {
 public:
  std::optional<Inputs> statistics_inputs(const Node& n) const override {
    if (!n.has_input(3) || !n.has_input(4)) return std::nullopt;
    return Inputs{3, 4};
  }
  std::optional<BatchNormAffine> affine(const Graph& g, const Node& n) const override { return batchnorm_affine(g, n); }
};

// 9 dropped the 'spatial' attribute (statistics per channel); 14 the training outputs.
class BatchNormLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {9, 14}; }
  void lift(LiftContext& c, Node& n, std::int64_t version) const override {
    if (version == 14) return drop_outputs(c, n, 1, "exists in training mode only from opset 14");
    if (!n.has_attr("spatial")) return;
    if (n.attr_int("spatial", 1) == 0 && c.rank(n.inputs.at(0)) != 2)
      c.refuse(n, "spatial = 0 (statistics per element, not per channel) has no equivalent in later opsets");
    n.attributes.erase("spatial");
    c.note(n, "'spatial' attribute removed");
  }
};

// Opset 18 normalized with scale and bias per group, 21 per channel: each group's value is
// repeated over its channels.
class GroupNormLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {21}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    const std::int64_t groups = n.attr_int("num_groups", 0);
    const auto dims = c.dims(n.inputs.at(0));
    const std::int64_t channels = dims.size() >= 2 ? dims[1] : -1;
    if (channels <= 0 || groups <= 0 || channels % groups)
      c.refuse(n, "the number of channels of its input is unknown");
    Graph& g = c.graph();
    for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {
      auto it = g.initializers.find(n.inputs.at(i));
      if (it == g.initializers.end())
        c.refuse(n, "its scale and bias are computed, not initializers; they must be expanded from groups to channels");
      if (it->second.numel() != groups)
        c.refuse(n, "its scale/bias has " + std::to_string(it->second.numel()) + " values for " +
                        std::to_string(groups) + " groups");
      n.inputs[i] = c.constant(n, i == 1 ? "scale_per_channel" : "bias_per_channel",
                               it->second.reshape({-1}).repeat_interleave(channels / groups));
    }
    c.note(n, "scale and bias per group -> per channel");
  }
};

void register_all(Registrar& r) {
  r.add_op<QConv>("Conv");
  r.add_op<QConvTranspose>("ConvTranspose");
  r.add_op<QGemm>("Gemm");
  r.add_op<QMatMul>("MatMul");
  r.add_op<QBatchNorm>("BatchNormalization");
  r.add_op<QMaxPool>("MaxPool");
  r.add_op<QAveragePool>("AveragePool");
  r.add_op<QGlobalAveragePool>("GlobalAveragePool");
  r.add_op<QGlobalMaxPool>("GlobalMaxPool");
  r.add_op<QInstanceNorm>("InstanceNormalization");
  r.add_op<QLayerNorm>("LayerNormalization");
  r.add_op<QGroupNorm>("GroupNormalization");
  r.add_op<QLRN>("LRN");
  r.add_op<QMeanVarianceNorm>("MeanVarianceNormalization");
  r.add_op_traits<TraitsOf<PerChannelNormalization, BatchNormLift, BatchNormStatistics>>("BatchNormalization");
  r.add_op_traits<SameMeaning<PerChannelNormalization>>("InstanceNormalization");
  for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})
    r.add_op_traits<SameMeaning<PooledChannels>>(op);
  r.add_op_traits<SameMeaning<ConvLayer<false>>>("Conv");
  r.add_op_traits<SameMeaning<ConvLayer<true>>>("ConvTranspose");
  r.add_op_traits<SameMeaning<GemmLayer>>("Gemm");
  r.add_op_traits<SameMeaning<MatMulLayer>>("MatMul");
  for (const char* op : {"LayerNormalization", "LRN", "MeanVarianceNormalization"}) r.add_op_traits<SameMeaning<>>(op);
  r.add_op_traits<GroupNormLift>("GroupNormalization");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.nn", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
