// LSQ (Esser et al., "Learned Step Size Quantization", ICLR 2020): the scale is a learnable
// parameter. Forward: v = clamp(x / s + zp, qmin, qmax), y = (round(v) - zp) * s with a
// straight-through round, so dy/ds = round(v) - zp - x/s inside the range and qmin - zp or
// qmax - zp outside; the scale's gradient is scaled by g = 1 / sqrt(N * qmax), N the elements
// per scale.
// Options: init = "observer" (start from the calibrated scale, default) or "lsq" (on the first
// forward, s = 2 mean|x| / sqrt(qmax), the paper's initialisation).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "ste.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

class LsqQuantizer final : public Quantizer {
 public:
  explicit LsqQuantizer(const QuantizerContext& c) : spec_(c.spec), where_(c.where) {
    init_ = c.options.get_string("init", "observer");
    if (init_ != "observer" && init_ != "lsq")
      throw Error(c.options.where() + ": init must be \"observer\" or \"lsq\", got \"" + init_ + "\"");
  }

  void initialize(const QParams& observed) override {
    scale_ = observed.scale.detach().to(at::kFloat).clone().set_requires_grad(true);
    zero_point_ = observed.zero_point.detach().clone();
    data_init_pending_ = init_ == "lsq";
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (!scale_.defined()) throw Error(where_ + ": quantizer used before calibration");
    if (scale_.device() != x.device()) {
      scale_ = scale_.detach().to(x.device()).set_requires_grad(true);
      zero_point_ = zero_point_.to(x.device());
    }
    const double qmax = double(spec_.qmax()), qmin = double(spec_.qmin());
    if (data_init_pending_) {
      c10::NoGradGuard no_grad;
      at::Tensor mean_abs = per_scale(quant_rows(x.detach(), spec_).abs().mean(1), x, spec_);
      scale_.copy_((mean_abs * (2.0 / std::sqrt(qmax))).clamp_min(kMinScale).reshape(scale_.sizes()));
      data_init_pending_ = false;
    }
    const double per_scale = double(x.numel()) / double(std::max<std::int64_t>(scale_.numel(), 1));
    // Clamped as qparams() clamps it, so a scale trained below the minimum simulates what exports.
    at::Tensor s = grad_scale(scale_, 1.0 / std::sqrt(per_scale * qmax)).clamp_min(kMinScale);
    return lsq_fake_quantize(x, s, zero_point_.to(x.scalar_type()), spec_);
  }

  QParams qparams() const override { return {scale_.detach().clamp_min(kMinScale), zero_point_}; }
  std::vector<at::Tensor> parameters() override { return {scale_}; }

 private:
  QSpec spec_;
  std::string where_;
  std::string init_;
  bool data_init_pending_ = false;
  at::Tensor scale_, zero_point_;
};

void register_all(Registrar& r) { r.add_quantizer<LsqQuantizer>("lsq"); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.lsq", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
