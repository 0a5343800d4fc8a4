// The percentile observer: clip the alpha tails of the negative and of the positive values
// separately (alpha defaults to 1e-3). With n_neg negative and n_pos non-negative values, the
// range is [k-th smallest value, k'-th largest value] with k = max(round(n_neg * alpha), 1) and
// k' = round(n_pos * alpha) + 1; a side without values contributes 0.
//
// Weights are observed once and use their exact order statistics. Activations stream into a
// histogram (Note [Streaming histogram]), so the result is within one bin width of the exact
// order statistic while memory stays fixed.
//
// Options ([w|a.observer_options]): alpha (0 < alpha < 0.5).

#include <ATen/ATen.h>

#include <cmath>

#include "histogram.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

class PercentileObserver final : public Observer, public MergeableObserver, public HandlesFloat8Elements {
 public:
  explicit PercentileObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {
    alpha_ = c.options.get_double("alpha", 1e-3);
    if (!(alpha_ > 0 && alpha_ < 0.5))
      throw Error(c.options.where() + ": alpha must be in (0, 0.5), got " + std::to_string(alpha_));
  }

  void observe(const at::Tensor& x) override {
    if (x.numel() == 0) return;
    shape_.assign(x.sizes().begin(), x.sizes().end());
    at::Tensor rows = channels_first(x.detach().to(at::kFloat), spec_);
    at::Tensor neg = (rows < 0).sum(1).to(at::kCPU, at::kDouble);
    neg_ = neg_.defined() ? neg_ + neg : neg;
    if (spec_.is_weight) {
      exact_ = rows.to(at::kCPU).contiguous();  // weights: observed once, exact
      return;
    }
    hist_.add(rows);
  }

  QParams compute() override {
    const bool exact = exact_.defined();
    if (!exact && hist_.empty()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
    const std::int64_t channels = exact ? exact_.size(0) : hist_.channels();
    const double total = exact ? double(exact_.size(1)) : double(hist_.count_per_channel());
    at::Tensor lo = at::zeros({channels}, at::kDouble), hi = at::zeros({channels}, at::kDouble);
    for (std::int64_t c = 0; c < channels; ++c) {
      const double n_neg = neg_[c].item<double>(), n_pos = total - n_neg;
      if (n_pos > 0) {
        const double k = total - std::max(std::round(n_pos * alpha_), 0.0);  // k-th smallest
        hi[c] = exact ? kth(c, k) : hist_.kth_smallest(c, k);
      }
      if (n_neg > 0) {
        const double k = std::max(std::round(n_neg * alpha_), 1.0);
        lo[c] = exact ? kth(c, k) : hist_.kth_smallest(c, k);
      }
    }
    return range_qparams(lo, hi, spec_, where_, shape_);
  }

  void reset() override {
    hist_.reset();
    exact_ = neg_ = at::Tensor();
  }

  std::vector<at::Tensor> state() const override { return histogram_observer_state(hist_, shape_, {neg_}); }
  void merge(const std::vector<at::Tensor>& other) override {
    const auto extra = merge_histogram_observer_state(other, 1, hist_, shape_, where_ + ": not a percentile state");
    if (extra.empty()) return;
    const at::Tensor neg = extra[0].to(at::kCPU, at::kDouble);
    neg_ = neg_.defined() ? neg_ + neg : neg.clone();
  }

 private:
  double kth(std::int64_t c, double k) const {
    return std::get<0>(at::kthvalue(exact_[c], static_cast<std::int64_t>(k))).item<double>();
  }

  QSpec spec_;
  std::string where_;
  std::vector<std::int64_t> shape_;  // of the observed tensor, to shape the parameters
  double alpha_;
  StreamingHistogram hist_;
  at::Tensor exact_, neg_;
};

void register_all(Registrar& r) { r.add_observer<PercentileObserver>("percentile"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.percentile", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
