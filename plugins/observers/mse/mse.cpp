// The MSE observer: among 80 candidate ranges [min, max] * (1 - 0.01 i), i = 0..79, take the
// one whose fake quantization has the lowest squared error, per channel (each channel's error
// is independent, so minimizing per channel also minimizes the total).
//
// Weights are observed once and use their exact values. Activations stream into a histogram
// (Note [Streaming histogram]) and the error is computed on its bin centres, weighted by counts.

#include <ATen/ATen.h>

#include <limits>

#include "histogram.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

constexpr int kCandidates = 80;

class MseObserver final : public Observer, public MergeableObserver, public HandlesFloat8Elements {
 public:
  explicit MseObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {}

  void observe(const at::Tensor& x) override {
    if (x.numel() == 0) return;
    shape_.assign(x.sizes().begin(), x.sizes().end());
    at::Tensor rows = channels_first(x.detach().to(at::kFloat), spec_);
    if (spec_.is_weight) {
      exact_ = rows.to(at::kCPU).contiguous();
      return;
    }
    hist_.add(rows);
  }

  QParams compute() override {
    at::Tensor values, weights, lo, hi;  // values [C, M] with weights [C, M]
    if (exact_.defined()) {
      values = exact_.to(at::kDouble);
      weights = at::ones_like(values);
      std::tie(lo, hi) = at::aminmax(values, 1);
    } else {
      if (hist_.empty()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
      values = hist_.centers().unsqueeze(0).expand({hist_.channels(), hist_.bins()});
      weights = hist_.counts();
      lo = hist_.min();
      hi = hist_.max();
    }
    QSpec per_row = spec_;
    per_row.per_channel = true;  // evaluate every row with its own parameters
    per_row.channel_axis = 0;
    per_row.group_size = 0;
    at::Tensor best_loss = at::full({values.size(0)}, std::numeric_limits<double>::infinity(), at::kDouble);
    at::Tensor best_lo = lo.clone(), best_hi = hi.clone();
    for (int i = 0; i < kCandidates; ++i) {
      const double shrink = 1.0 - 0.01 * i;
      at::Tensor clo = lo * shrink, chi = hi * shrink;
      QParams p = qparams_from_range(clo, chi, per_row, where_);
      at::Tensor err = fake_quantize(values.to(at::kFloat), p, per_row).to(at::kDouble) - values;
      at::Tensor loss = (err * err * weights).sum(1);
      at::Tensor better = loss < best_loss;
      best_loss = at::where(better, loss, best_loss);
      best_lo = at::where(better, clo, best_lo);
      best_hi = at::where(better, chi, best_hi);
    }
    return range_qparams(best_lo, best_hi, spec_, where_, shape_);
  }

  void reset() override {
    hist_.reset();
    exact_ = at::Tensor();
  }

  std::vector<at::Tensor> state() const override { return histogram_observer_state(hist_, shape_); }
  void merge(const std::vector<at::Tensor>& other) override {
    merge_histogram_observer_state(other, 0, hist_, shape_, where_ + ": not an mse state");
  }

 private:
  QSpec spec_;
  std::string where_;
  std::vector<std::int64_t> shape_;  // of the observed tensor, to shape the parameters
  StreamingHistogram hist_;
  at::Tensor exact_;
};

void register_all(Registrar& r) { r.add_observer<MseObserver>("mse"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.mse", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
