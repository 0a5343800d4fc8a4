// LSQ+ (Bhalgat et al., "LSQ+: Improving low-bit quantization through learnable offsets and
// better initialization", CVPRW 2020): learnable scale s and offset beta. The offset acts through
// the integer zero point z = round(-beta / s) (straight-through), so the simulated grid is the one
// QuantizeLinear exports:
//   y = (round(clamp(x / s + z, qmin, qmax)) - z) * s   (straight-through round),
// which equals the paper's round(clamp((x - beta) / s)) * s + beta whenever -beta / s is an
// integer, and has its gradients: dy/dbeta is 0 inside the range and 1 outside, dy/ds is
// round(v) - v inside (v = x / s + z; z's dependence on s is not differentiated). Weights start symmetric with
// s = max(|mean - 3 std|, |mean + 3 std|) / 2^(b-1) per channel; activations start from the
// observer (beta = -zero_point * s). Export: zero point = round(-beta / s), clamped.
// The scale's gradient is scaled like LSQ's.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "ste.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

class LsqPlusQuantizer final : public Quantizer {
 public:
  explicit LsqPlusQuantizer(const QuantizerContext& c) : spec_(c.spec), where_(c.where) {}

  void initialize(const QParams& observed) override {
    at::Tensor s = observed.scale.detach().to(at::kFloat).clone();
    beta_ = (-observed.zero_point.to(at::kFloat) * s).clone().set_requires_grad(!spec_.is_weight || !spec_.symmetric);
    scale_ = s.set_requires_grad(true);
    sigma_init_pending_ = spec_.is_weight;
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (!scale_.defined()) throw Error(where_ + ": quantizer used before calibration");
    if (scale_.device() != x.device()) {
      scale_ = scale_.detach().to(x.device()).set_requires_grad(true);
      beta_ = beta_.detach().to(x.device()).set_requires_grad(!spec_.is_weight || !spec_.symmetric);
    }
    if (sigma_init_pending_) {
      c10::NoGradGuard no_grad;
      at::Tensor rows = quant_rows(x.detach(), spec_);
      at::Tensor mean = rows.mean(1), std = rows.std(1, /*unbiased=*/false);
      at::Tensor bound = per_scale(at::maximum((mean - 3 * std).abs(), (mean + 3 * std).abs()), x, spec_);
      scale_.copy_((bound / double(std::int64_t{1} << (spec_.bits - 1))).clamp_min(kMinScale).reshape(scale_.sizes()));
      sigma_init_pending_ = false;
    }
    const double qmax = double(spec_.qmax()), qmin = double(spec_.qmin());
    const double per_scale = double(x.numel()) / double(std::max<std::int64_t>(scale_.numel(), 1));
    // Clamped as qparams() clamps it, so a scale trained below the minimum simulates what exports.
    at::Tensor s = grad_scale(scale_, 1.0 / std::sqrt(per_scale * qmax)).clamp_min(kMinScale);
    at::Tensor z = round_ste(-beta_ / scale_.detach().clamp_min(kMinScale)).clamp(qmin, qmax);
    return lsq_fake_quantize(x, s, z, spec_);
  }

  QParams qparams() const override {
    at::Tensor s = scale_.detach().clamp_min(kMinScale);
    at::Tensor zp = at::round(-beta_.detach() / s).clamp(double(spec_.qmin()), double(spec_.qmax())).to(at::kInt);
    return {s, zp};
  }
  std::vector<at::Tensor> parameters() override {
    if (beta_.requires_grad()) return {scale_, beta_};
    return {scale_};
  }

 private:
  QSpec spec_;
  std::string where_;
  bool sigma_init_pending_ = false;
  at::Tensor scale_, beta_;
};

void register_all(Registrar& r) { r.add_quantizer<LsqPlusQuantizer>("lsq_plus"); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.lsq_plus", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
