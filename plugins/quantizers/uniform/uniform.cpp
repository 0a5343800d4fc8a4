// The uniform quantizer: fixed scale and zero point from calibration, round half to even,
// straight-through gradient inside the clamp range (Note [Quantization arithmetic] in
// sparsebit/sdk/quant.h); on float8 specs the same with float8 rounding (Note [Float8 elements]).

#include <ATen/ATen.h>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

class UniformQuantizer final : public Quantizer, public HandlesFloat8Elements {
 public:
  explicit UniformQuantizer(const QuantizerContext& c) : spec_(c.spec), where_(c.where) {}

  void initialize(const QParams& observed) override { params_ = observed; }

  at::Tensor forward(const at::Tensor& x) override {
    if (!params_.defined()) throw Error(where_ + ": quantizer used before calibration");
    if (params_.scale.device() != x.device()) {
      params_.scale = params_.scale.to(x.device());
      params_.zero_point = params_.zero_point.to(x.device());
    }
    return fake_quantize(x, params_, spec_);
  }

  QParams qparams() const override { return params_; }

 private:
  QSpec spec_;
  std::string where_;
  QParams params_;
};

void register_all(Registrar& r) { r.add_quantizer<UniformQuantizer>("uniform"); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.uniform", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
