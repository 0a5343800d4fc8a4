// An observer: the mean over batches of each batch's min and max. Less sensitive to a single
// outlier batch than minmax. It streams: memory is two running sums whatever the data size.

#include <ATen/ATen.h>

#include "example.h"

namespace example {

class MeanRangeObserver final : public sparsebit::Observer {
 public:
  explicit MeanRangeObserver(const sparsebit::ObserverContext& ctx) : spec_(ctx.spec), where_(ctx.where) {
    // Options come from [w.observer_options] / [a.observer_options]; unread keys are refused
    // by the host, so every option a user may set must be read here.
    min_batches_ = ctx.options.get_int("min_batches", 1);
    if (min_batches_ < 1) throw sparsebit::Error(ctx.options.where() + ": min_batches must be >= 1");
  }

  void observe(const at::Tensor& x_in) override {
    at::Tensor x = x_in.detach().to(at::kFloat);
    if (x.numel() == 0) return;
    at::Tensor lo, hi;
    if (spec_.per_channel) {
      at::Tensor flat = x.movedim(spec_.channel_axis, 0).reshape({x.size(spec_.channel_axis), -1});
      std::tie(lo, hi) = at::aminmax(flat, 1);
    } else {
      std::tie(lo, hi) = at::aminmax(x);
    }
    sum_min_ = sum_min_.defined() ? sum_min_ + lo : lo;
    sum_max_ = sum_max_.defined() ? sum_max_ + hi : hi;
    ++batches_;
  }

  sparsebit::QParams compute() override {
    if (batches_ < min_batches_) {
      throw sparsebit::Error(where_ + ": observed " + std::to_string(batches_) +
                             " batches, mean_range needs at least " + std::to_string(min_batches_));
    }
    // The shared helper widens the range to include 0 and rounds like ONNX Runtime.
    return sparsebit::qparams_from_range(sum_min_ / double(batches_), sum_max_ / double(batches_), spec_, where_);
  }

  void reset() override {
    sum_min_ = at::Tensor();
    sum_max_ = at::Tensor();
    batches_ = 0;
  }

 private:
  sparsebit::QSpec spec_;
  std::string where_;
  std::int64_t min_batches_ = 1;
  std::int64_t batches_ = 0;
  at::Tensor sum_min_, sum_max_;
};

void register_mean_range_observer(sparsebit::Registrar& r) { r.add_observer<MeanRangeObserver>("mean_range"); }

}  // namespace example
