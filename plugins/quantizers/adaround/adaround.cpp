// AdaRound (Nagel et al., "Up or Down? Adaptive Rounding for Post-Training Quantization",
// ICML 2020): each weight is rounded down or up, whichever makes the layer's output closest
// to the float layer's, learnt by the layerwise calibration runner.
//
// Soft rounding during reconstruction: w_q = s * (clamp(floor(w / s) + h(V) + zp, qmin, qmax) - zp)
// with the rectified sigmoid h(V) = clamp(sigmoid(V) * (zeta - gamma) + gamma, 0, 1),
// zeta = 1.1, gamma = -0.1. V starts where h(V) equals the fractional part of w / s (so the
// soft weight starts as the float weight). The regularizer
//     lambda * sum(1 - |2 h(V) - 1|^beta)
// is off for the first `warm_up` fraction of the iterations, then beta falls linearly from
// beta_start to beta_end, pushing every h(V) to 0 or 1. At the end the rounding is fixed at
// h = [V >= 0] and the quantizer stays on the integer grid of its (unchanged) scale.
//
// Options: iterations (20000), batch_size (32), learning_rate (1e-3, Adam), warm_up (0.2),
// lambda (0.01), beta_start (20), beta_end (2), seed (0).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

constexpr double kZeta = 1.1, kGamma = -0.1;

class AdaRoundQuantizer final : public Quantizer, public ReconstructedByLayer, public PenaltyOnDevice {
 public:
  explicit AdaRoundQuantizer(const QuantizerContext& c) : spec_(c.spec), where_(c.where) {
    if (!spec_.is_weight) {
      throw Error(c.options.where() +
                  ": adaround learns the rounding of weights; use it under [w] (activations: "
                  "uniform, lsq, pact ...)");
    }
    settings_.iterations = c.options.get_int("iterations", 20000);
    settings_.batch_size = c.options.get_int("batch_size", 32);
    settings_.learning_rate = c.options.get_double("learning_rate", 1e-3);
    settings_.seed = static_cast<std::uint64_t>(c.options.get_int("seed", 0));
    warm_up_ = c.options.get_double("warm_up", 0.2);
    lambda_ = c.options.get_double("lambda", 0.01);
    beta_start_ = c.options.get_double("beta_start", 20.0);
    beta_end_ = c.options.get_double("beta_end", 2.0);
    auto require = [&](bool ok, const char* what) {
      if (!ok) throw Error(c.options.where() + ": " + what);
    };
    // Bounded so that a typo cannot start a run that never ends (the paper's 20,000 is the default).
    require(settings_.iterations >= 1 && settings_.iterations <= 10'000'000, "iterations must be 1 to 10000000");
    require(settings_.batch_size >= 1 && settings_.batch_size <= 1 << 20, "batch_size must be 1 to 1048576");
    require(settings_.learning_rate > 0, "learning_rate must be > 0");
    require(warm_up_ >= 0 && warm_up_ < 1, "warm_up must be in [0, 1)");
    require(lambda_ >= 0, "lambda must be >= 0");
    require(beta_start_ >= beta_end_ && beta_end_ > 0, "beta_start >= beta_end > 0 is required");
  }

  void initialize(const QParams& observed) override {
    params_ = observed;
    state_ = State::kNearest;
    v_ = at::Tensor();
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (!params_.defined()) throw Error(where_ + ": quantizer used before calibration");
    if (params_.scale.device() != x.device()) {
      params_.scale = params_.scale.to(x.device());
      params_.zero_point = params_.zero_point.to(x.device());
      if (v_.defined()) v_ = v_.detach().to(x.device()).set_requires_grad(state_ == State::kSoft);
    }
    if (state_ == State::kNearest) return fake_quantize(x, params_, spec_);
    if (x.sizes() != v_.sizes()) {
      throw Error(where_ + ": adaround learnt the rounding of a weight of shape " + c10::str(v_.sizes()) +
                  ", got shape " + c10::str(x.sizes()));
    }
    if (state_ == State::kSoft) return soft_round_quantize(x, v_, params_, spec_, kZeta, kGamma);
    const at::Tensor s = expand_param(params_.scale.to(x.scalar_type()), x, spec_);
    const at::Tensor zp = expand_param(params_.zero_point.to(x.scalar_type()), x, spec_);
    const at::Tensor q = at::clamp(at::floor(x.detach() / s) + (v_ >= 0).to(x.scalar_type()) + zp, double(spec_.qmin()),
                                   double(spec_.qmax()));
    return (q - zp) * s;
  }

  QParams qparams() const override { return params_; }
  std::vector<at::Tensor> parameters() override {
    return state_ == State::kSoft ? std::vector<at::Tensor>{v_} : std::vector<at::Tensor>{};
  }

  ReconstructionSettings settings() const override { return settings_; }

  void begin_reconstruction(const at::Tensor& weight) override {
    if (!params_.defined()) throw Error(where_ + ": reconstruction started before calibration");
    c10::NoGradGuard no_grad;
    const at::Tensor w = weight.detach().to(at::kFloat);
    const at::Tensor s = expand_param(params_.scale.to(w.device(), at::kFloat), w, spec_);
    const at::Tensor rest = w / s - at::floor(w / s);  // in [0, 1)
    v_ = (-at::log((kZeta - kGamma) / (rest - kGamma) - 1)).contiguous();
    v_.set_requires_grad(true);
    state_ = State::kSoft;
  }

  at::Tensor reconstruction_penalty(std::int64_t step) override {
    if (state_ != State::kSoft) return {};
    const double warm = warm_up_ * double(settings_.iterations);
    if (double(step) < warm || lambda_ == 0) return at::zeros({}, v_.options().requires_grad(false));
    const double rel = (double(step) - warm) / std::max(1.0, double(settings_.iterations) - warm);
    const double beta = beta_end_ + (beta_start_ - beta_end_) * std::max(0.0, 1.0 - rel);
    return lambda_ * (1 - (2 * rectified_sigmoid(v_) - 1).abs().pow(beta)).sum();
  }

  // The same arithmetic with the step on the device; the regularizer's weight is 0 during the
  // warm-up instead of the term being left out, and |2h - 1| is kept above 1e-30 so that
  // its gradient stays finite (times 0) for beta < 1.
  at::Tensor reconstruction_penalty_on_device(const at::Tensor& step) override {
    if (state_ != State::kSoft || lambda_ == 0) return at::Tensor();
    const double warm = warm_up_ * double(settings_.iterations);
    const at::Tensor t = step.to(at::kDouble);
    const at::Tensor rel = (t - warm) / std::max(1.0, double(settings_.iterations) - warm);
    const at::Tensor beta = ((1 - rel).clamp_min(0) * (beta_start_ - beta_end_) + beta_end_).to(v_.scalar_type());
    const at::Tensor on = (t >= warm).to(v_.scalar_type()) * lambda_;
    return on * (1 - (2 * rectified_sigmoid(v_) - 1).abs().clamp_min(1e-30).pow(beta)).sum();
  }

  void end_reconstruction() override {
    if (state_ != State::kSoft) return;
    v_ = v_.detach();
    state_ = State::kHard;
  }

 private:
  enum class State { kNearest, kSoft, kHard };
  static at::Tensor rectified_sigmoid(const at::Tensor& v) {
    return at::clamp(at::sigmoid(v) * (kZeta - kGamma) + kGamma, 0, 1);
  }

  QSpec spec_;
  std::string where_;
  ReconstructionSettings settings_;
  double warm_up_, lambda_, beta_start_, beta_end_;
  QParams params_;
  State state_ = State::kNearest;
  at::Tensor v_;  // one rounding variable per weight element
};

void register_all(Registrar& r) { r.add_quantizer<AdaRoundQuantizer>("adaround"); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.adaround", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
