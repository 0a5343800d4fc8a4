// Ops with weights, the pooling family and the normalizations: Conv, ConvTranspose, Gemm,
// MatMul, BatchNormalization, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool here;
// InstanceNormalization, LayerNormalization, GroupNormalization, LRN and
// MeanVarianceNormalization in nn_norm_ops.cpp; what the ops tell the passes in nn_traits.cpp.
//
// Quantization roles follow the original toolkit: Conv/Gemm/MatMul quantize their input
// activation and their weight (per channel along the output-channel axis); average pooling
// quantizes its input; MaxPool commutes with quantization and passes through; BN is kept in
// float (it is folded into the conv by the exporter or by fuse_bn); the other norms quantize
// their input and keep scale and bias in float.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "ops_common.h"
#include "sparsebit/sdk/data_parallel.h"
#include "nn_ops.h"
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
  register_norm_ops(r);
  register_traits(r);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.nn", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
