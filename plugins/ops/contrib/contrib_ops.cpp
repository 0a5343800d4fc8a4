// ONNX Runtime's fused operators (domain com.microsoft, and SimplifiedLayerNormalization, which
// ONNX Runtime registers in the default domain): what its transformer optimizer and Optimum
// write into the models they save. Semantics as ONNX Runtime's contrib operator documentation
// gives them; tests/test_contrib_ops.cpp checks each against ONNX Runtime on random inputs. The
// attention operators are in contrib_attention.cpp.
//
// Roles follow the unfused ops they replace: the GELU family and the normalizations quantize
// their input (and the skip, which is the other side of a residual Add); FusedConv and
// FusedMatMul quantize their input and their constant weight, as Conv and MatMul do; biases
// stay float where the unfused graph would have added them after the integer kernel.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "contrib_ops.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

/// Gelu (exact, erf), FastGelu (tanh approximation, optional bias), BiasGelu (exact, bias
/// required), QuickGelu (x * sigmoid(alpha x)).
class QGeluFamily final : public NodeQModule {
 public:
  enum class Kind { kGelu, kFast, kBias, kQuick };
  QGeluFamily(const OpContext& c, Kind kind) : NodeQModule(c), kind_(kind), alpha_(c.node.attr_float("alpha", 1.702)) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor x = in.at(0);
    const at::Tensor& bias = optional_input(in, 1);
    if (kind_ == Kind::kBias && !bias.defined()) throw Error(describe() + ": BiasGelu needs its bias input");
    if (bias.defined()) x = x + bias;
    switch (kind_) {
      case Kind::kFast: return {at::gelu(x, "tanh")};
      case Kind::kQuick: return {x * at::sigmoid(x * alpha_)};
      default: return {at::gelu(x)};
    }
  }

 private:
  Kind kind_;
  double alpha_;
};

/// Y = X + bias + skip (bias over the last axis).
class QBiasAdd final : public NodeQModule {
 public:
  explicit QBiasAdd(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {}, {InputRole::kActivation, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {in.at(0) + in.at(1) + in.at(2)};
  }
};

/// SkipLayerNormalization and SkipSimplifiedLayerNormalization: s = input + skip (+ bias),
/// y = norm(s) * gamma (+ beta); outputs y, mean, inv_std_var, s. Inputs: input, skip, gamma,
/// then beta and bias (Skip) or bias alone (SkipSimplified).
class QSkipNorm final : public NodeQModule {
 public:
  QSkipNorm(const OpContext& c, bool simplified)
      : NodeQModule(c), simplified_(simplified), eps_(c.node.attr_float("epsilon", 1e-12)) {}
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kActivation, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& gamma = in.at(2);
    const at::Tensor beta = simplified_ ? at::Tensor() : optional_input(in, 3);
    const at::Tensor& bias = optional_input(in, simplified_ ? 3 : 4);
    at::Tensor sum = x + in.at(1);
    if (bias.defined()) sum = sum + bias;
    const at::Tensor stats = sum.scalar_type() == at::kDouble ? sum : sum.to(at::kFloat);  // float32 statistics
    const Normalized r = normalize(stats, {sum.dim() - 1}, eps_, simplified_);
    at::Tensor y = r.y.to(sum.scalar_type()) * gamma;
    if (beta.defined()) y = y + beta;
    const std::int64_t keep = std::max<std::int64_t>(0, x.dim() - 1);
    std::vector<std::int64_t> stat_shape(x.sizes().begin(), x.sizes().begin() + keep);
    stat_shape.push_back(1);
    at::Tensor mean = simplified_ ? at::zeros(stat_shape, r.inv_std.options()) : r.mean.reshape(stat_shape);
    return {y, mean, r.inv_std.reshape(stat_shape), sum};
  }

 private:
  bool simplified_;
  double eps_;
};

/// SimplifiedLayerNormalization (RMS normalization over the axes from `axis` on): y = x /
/// sqrt(mean(x^2) + eps) * scale; outputs y and inv_std_var.
class QSimplifiedLayerNorm final : public NodeQModule {
 public:
  explicit QSimplifiedLayerNorm(const OpContext& c)
      : NodeQModule(c), axis_(c.node.attr_int("axis", -1)), eps_(c.node.attr_float("epsilon", 1e-5)) {}
  std::vector<InputSpec> input_specs() const override { return {{InputRole::kActivation, 0}}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor xs = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);  // float32 statistics
    const Normalized r = normalize(xs, axes_from(axis_, x.dim(), node()), eps_, /*rms=*/true);
    return {r.y.to(x.scalar_type()) * in.at(1), r.inv_std};
  }

 private:
  std::int64_t axis_;
  double eps_;
};

/// FusedConv: activation(Conv(X, W, B) + Z) with the activation named by `activation` and its
/// parameters in `activation_params`.
class QFusedConv final : public NodeQModule {
 public:
  explicit QFusedConv(const OpContext& c)
      : NodeQModule(c),
        win_(c.node),
        group_(c.node.attr_int("group", 1)),
        activation_(c.node.attr_string("activation", "")),
        params_(c.node.attr_floats("activation_params")) {
    if (group_ < 1) throw Error(describe() + ": group must be >= 1");
    static const std::vector<std::string> known = {"", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid"};
    if (std::find(known.begin(), known.end(), activation_) == known.end())
      throw Error(describe() + ": activation '" + activation_ +
                  "' is not one of Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid");
    const std::size_t need = activation_ == "LeakyRelu"                                ? 1
                             : (activation_ == "Clip" || activation_ == "HardSigmoid") ? 2
                                                                                       : 0;
    if (params_.size() < need)
      throw Error(describe() + ": activation " + activation_ + " needs " + std::to_string(need) +
                  " activation_params, the node has " + std::to_string(params_.size()));
  }
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, 0}, {InputRole::kBias, 0}, {InputRole::kActivation, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor y = onnx_conv(in.at(0), in.at(1), optional_input(in, 2), win_, group_, node());
    if (const at::Tensor& z = optional_input(in, 3); z.defined()) y = y + z;
    if (activation_ == "Relu") return {at::relu(y)};
    if (activation_ == "Tanh") return {at::tanh(y)};
    if (activation_ == "Sigmoid") return {at::sigmoid(y)};
    if (activation_ == "LeakyRelu") return {at::where(y < 0, y * params_[0], y)};
    if (activation_ == "Clip") return {at::clamp(y, params_[0], params_[1])};
    if (activation_ == "HardSigmoid") return {at::clamp(y * params_[0] + params_[1], 0.0, 1.0)};
    return {y};
  }

 private:
  Window win_;
  std::int64_t group_;
  std::string activation_;
  std::vector<double> params_;
};

/// FusedMatMul: alpha * A' @ B', where transBatch moves the first axis behind the other batch
/// axes and trans swaps the last two.
class QFusedMatMul final : public NodeQModule {
 public:
  explicit QFusedMatMul(const OpContext& c)
      : NodeQModule(c),
        alpha_(c.node.attr_float("alpha", 1.0)),
        trans_a_(c.node.attr_int("transA", 0) != 0),
        trans_b_(c.node.attr_int("transB", 0) != 0),
        batch_a_(c.node.attr_int("transBatchA", 0) != 0),
        batch_b_(c.node.attr_int("transBatchB", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override {
    // A constant B is a weight whose output channels are its last axis, or the one before when
    // it is transposed.
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, trans_b_ ? -2 : -1}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor a = arrange(in.at(0), batch_a_, trans_a_), b = arrange(in.at(1), batch_b_, trans_b_);
    at::Tensor y = at::matmul(a, b);
    return {alpha_ == 1.0 ? y : y * alpha_};
  }

 private:
  static at::Tensor arrange(at::Tensor t, bool batch, bool trans) {
    if (batch && t.dim() > 2) {
      std::vector<std::int64_t> perm;
      for (std::int64_t d = 1; d < t.dim() - 1; ++d) perm.push_back(d);
      perm.push_back(0);
      perm.push_back(t.dim() - 1);
      t = t.permute(perm);
    }
    return trans && t.dim() >= 2 ? t.transpose(-1, -2) : t;
  }
  double alpha_;
  bool trans_a_, trans_b_, batch_a_, batch_b_;
};

void register_all(Registrar& r) {
  using Kind = QGeluFamily::Kind;
  r.add_op_factory("Gelu", kMs, [](const OpContext& c) { return std::make_unique<QGeluFamily>(c, Kind::kGelu); });
  r.add_op_factory("FastGelu", kMs, [](const OpContext& c) { return std::make_unique<QGeluFamily>(c, Kind::kFast); });
  r.add_op_factory("BiasGelu", kMs, [](const OpContext& c) { return std::make_unique<QGeluFamily>(c, Kind::kBias); });
  r.add_op_factory("QuickGelu", kMs, [](const OpContext& c) { return std::make_unique<QGeluFamily>(c, Kind::kQuick); });
  r.add_op<QBiasAdd>("BiasAdd", kMs);
  r.add_op_factory("SkipLayerNormalization", kMs,
                   [](const OpContext& c) { return std::make_unique<QSkipNorm>(c, false); });
  r.add_op_factory("SkipSimplifiedLayerNormalization", kMs,
                   [](const OpContext& c) { return std::make_unique<QSkipNorm>(c, true); });
  r.add_op<QSimplifiedLayerNorm>("SimplifiedLayerNormalization", "");
  r.add_op<QSimplifiedLayerNorm>("SimplifiedLayerNormalization", kMs);
  r.add_op<QFusedConv>("FusedConv", kMs);
  r.add_op<QFusedMatMul>("FusedMatMul", kMs);
  register_attention_ops(r);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.contrib", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
