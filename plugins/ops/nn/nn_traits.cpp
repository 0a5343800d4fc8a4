// What the nn plugin's ops tell the passes: weighted layers' shapes and bias compensation
// and checks at import, channel flow, running statistics and opset lifts.

#include <ATen/ATen.h>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "nn_ops.h"

namespace sparsebit::ops {
namespace {

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

}  // namespace

void register_traits(Registrar& r) {
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

}  // namespace sparsebit::ops
