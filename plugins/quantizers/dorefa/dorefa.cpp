// DoReFa weights (Zhou et al., "DoReFa-Net", 2016): w_t = tanh(w) / (2 max|tanh(w)|) + 1/2
// in [0, 1], quantized to k = bits levels as round(w_t (2^k - 1)) / (2^k - 1) (straight
// through), mapped back to [-1, 1]: w_q = 2 q - 1. Weights only. Its grid has a half-integer
// zero point, which QuantizeLinear cannot express, so exported models carry the simulated
// float weights (affine_grid() is false).

#include <ATen/ATen.h>

#include "ste.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

class DorefaQuantizer final : public Quantizer {
 public:
  explicit DorefaQuantizer(const QuantizerContext& c) : spec_(c.spec), where_(c.where) {
    if (!spec_.is_weight) throw Error(where_ + ": DoReFa quantizes weights; use it in [w], not [a]");
  }

  void initialize(const QParams& observed) override { observed_ = observed; }

  at::Tensor forward(const at::Tensor& w) override {
    const double levels = double((std::int64_t{1} << spec_.bits) - 1);
    at::Tensor t = at::tanh(w);
    at::Tensor wt = t / (2 * t.abs().max().detach()) + 0.5;
    return 2 * (round_ste(wt * levels) / levels) - 1;
  }

  QParams qparams() const override { return observed_; }
  bool affine_grid() const override { return false; }

 private:
  QSpec spec_;
  std::string where_;
  QParams observed_;
};

void register_all(Registrar& r) { r.add_quantizer<DorefaQuantizer>("dorefa"); }

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.dorefa", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
