// PACT (Choi et al., "PACT: Parameterized Clipping Activation for Quantized Neural Networks",
// 2018), for activations: a learnable clip alpha (per tensor).
//   c = clamp(x, lo, alpha) with lo = 0 (affine scheme) or -alpha (symmetric scheme)
//   y = c + (round(c / s) * s - c), straight through, with s = (alpha - lo) / (qmax - qmin)
// so dy/dx = 1 inside [lo, alpha] and 0 outside, and dy/dalpha = 1 where x >= alpha (and -1
// where x <= -alpha, symmetric), exactly the paper's gradient.
// Options: alpha (initial clip, default 10).

#include <ATen/ATen.h>

#include "ste.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

class PactQuantizer final : public Quantizer {
 public:
  explicit PactQuantizer(const QuantizerContext& c) : spec_(c.spec), where_(c.where) {
    if (spec_.is_weight) throw Error(where_ + ": PACT clips activations; use it in [a], not [w]");
    if (spec_.per_channel) throw Error(where_ + ": PACT learns one clip per tensor; use a per-tensor scheme");
    init_alpha_ = c.options.get_double("alpha", 10.0);
    if (!(init_alpha_ > 0)) throw Error(c.options.where() + ": alpha must be > 0");
  }

  void initialize(const QParams&) override {
    alpha_ = at::scalar_tensor(init_alpha_, at::kFloat).set_requires_grad(true);
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (!alpha_.defined()) throw Error(where_ + ": quantizer used before calibration");
    if (alpha_.device() != x.device()) alpha_ = alpha_.detach().to(x.device()).set_requires_grad(true);
    at::Tensor a = alpha_.to(x.scalar_type());
    at::Tensor lo = spec_.symmetric ? -a : at::zeros_like(a);
    at::Tensor c = at::minimum(at::maximum(x, lo), a);
    at::Tensor s = ((a - lo) / double(spec_.qmax() - spec_.qmin())).detach();
    at::Tensor zp = spec_.symmetric ? at::zeros_like(s) : at::round(-lo / s).detach();
    at::Tensor q = at::clamp(at::round(c.detach() / s) + zp, double(spec_.qmin()), double(spec_.qmax()));
    return c + ((q - zp) * s - c).detach();
  }

  QParams qparams() const override {
    const double a = alpha_.item<double>();
    QParams p = qparams_from_range(at::scalar_tensor(spec_.symmetric ? -a : 0.0), at::scalar_tensor(a), spec_, where_);
    return p;
  }
  std::vector<at::Tensor> parameters() override { return {alpha_}; }

 private:
  QSpec spec_;
  std::string where_;
  double init_alpha_;
  at::Tensor alpha_;
};

void register_all(Registrar& r) { r.add_quantizer<PactQuantizer>("pact"); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.pact", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
