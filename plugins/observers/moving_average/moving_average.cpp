// The moving-average observer (activations): an exponential moving average of each batch's
// minimum and maximum, min <- ratio * min + (1 - ratio) * batch_min, started from the first
// batch. Options: ema_ratio (default 0.9, in [0, 1)).

#include <ATen/ATen.h>

#include "histogram.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

class MovingAverageObserver final : public Observer, public HandlesFloat8Elements {
 public:
  explicit MovingAverageObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {
    ratio_ = c.options.get_double("ema_ratio", 0.9);
    if (!(ratio_ >= 0 && ratio_ < 1)) throw Error(c.options.where() + ": ema_ratio must be in [0, 1)");
  }

  void observe(const at::Tensor& x) override {
    if (x.numel() == 0) return;
    try {
      param_layout(x, spec_);  // the channel or group axis exists
    } catch (const Error& e) {
      throw Error(where_ + ": " + e.what());
    }
    auto [lo, hi] = range_per_param(x, spec_);  // parameter-shaped; device kernels when registered
    lo = lo.to(at::kCPU, at::kDouble);
    hi = hi.to(at::kCPU, at::kDouble);
    if (!min_.defined()) {
      min_ = lo;
      max_ = hi;
    } else {
      min_ = min_ * ratio_ + lo * (1 - ratio_);
      max_ = max_ * ratio_ + hi * (1 - ratio_);
    }
  }

  QParams compute() override {
    if (!min_.defined()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
    return qparams_from_range(min_, max_, spec_, where_);
  }

  void reset() override { min_ = max_ = at::Tensor(); }

 private:
  QSpec spec_;
  std::string where_;
  double ratio_;
  at::Tensor min_, max_;
};

void register_all(Registrar& r) { r.add_observer<MovingAverageObserver>("moving_average"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.moving_average", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
