// The auto observer: one streaming histogram per activation (Note [Streaming histogram]) and
// several ranges read from it, among which the host picks per quantized input by the error of
// the layer that consumes it (Note [Range selection] in observer.h):
//   minmax              [min, max]
//   mse                 [min, max] * (1 - 0.01 i), i = 0..98, least squared error on the grid
//                       (the mse observer's search, continued to 1% of the range)
//   percentile 1e-5     each side's alpha tail cut (as the percentile observer computes it)
//   percentile 1e-4
//   percentile 0.001
// Ranges whose grids coincide (scale and zero point within 0.1%) are offered once. compute()
// returns the one with the least squared error on the tensor itself: the choice where the host
// does not select (layerwise modes, hosts of their own).
//
// Why several: no single rule holds on real models. Where a few large values carry what the
// next layer needs, clipping them ruins the output; where they are rare noise, minmax wastes most
// of the grid on them (PP-OCRv4's recognizer: minmax 76% exact-match, mse 96%, percentile 1e-3
// 98%, FP32 99.5%; docs/ACCURACY.md). The consuming layer's error tells them apart.
//
// Not a candidate: TensorRT's entropy threshold. Its divergence compares shapes, not values
// (Note [Clipping floor] in histogram.h), and the consuming layer's error, measured with every
// other input float, does not see how much a clipped tail matters further down: offered, it was
// chosen for 11 of PP-OCRv4's recognizer's 168 inputs and exact-match fell from 99.0% to 94.5%.
//
// Weights (observed once, exact values) get their min and max: use [w] observer = "mse" for
// clipped weights.

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "histogram.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

constexpr int kShrinkSteps = 99;
constexpr double kAlphas[] = {1e-5, 1e-4, 1e-3};

class AutoObserver final : public Observer,
                           public MergeableObserver,
                           public OffersRanges,
                           public HandlesFloat8Elements {
 public:
  explicit AutoObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {}

  void observe(const at::Tensor& x) override {
    if (x.numel() == 0) return;
    shape_.assign(x.sizes().begin(), x.sizes().end());
    at::Tensor rows = channels_first(x.detach().to(at::kFloat), spec_);
    if (spec_.is_weight) {
      std::tie(weight_lo_, weight_hi_) = at::aminmax(rows, 1);
      weight_lo_ = weight_lo_.to(at::kCPU, at::kDouble);
      weight_hi_ = weight_hi_.to(at::kCPU, at::kDouble);
      return;
    }
    hist_.add(rows);
    offered_.clear();
  }

  std::vector<RangeCandidate> candidates() override {
    if (spec_.is_weight) return {};
    if (hist_.empty()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
    if (!offered_.empty()) return offered_;  // nothing observed since
    std::vector<std::pair<std::string, std::pair<at::Tensor, at::Tensor>>> ranges;
    const at::Tensor lo = hist_.min(), hi = hist_.max();
    ranges.push_back({"minmax", {lo, hi}});
    ranges.push_back({"mse", mse_range()});
    for (double alpha : kAlphas) ranges.push_back({"percentile " + short_number(alpha), percentile_range(alpha)});
    std::vector<RangeCandidate> out;
    for (auto& [name, range] : ranges) {
      QParams p = range_qparams(range.first, range.second, spec_, where_, shape_);
      bool seen = false;
      for (const auto& c : out) seen = seen || same_grid(c.params, p);
      if (!seen) out.push_back({name, std::move(p)});
    }
    offered_ = out;
    return out;
  }

  QParams compute() override {
    if (spec_.is_weight) {
      if (!weight_lo_.defined()) throw Error(where_ + ": nothing was observed");
      return range_qparams(weight_lo_, weight_hi_, spec_, where_, shape_);
    }
    const auto all = candidates();
    double best = std::numeric_limits<double>::infinity();
    QParams chosen;
    for (const auto& c : all) {
      const double e = grid_error(c.params).sum().item<double>();
      if (e < best) best = e, chosen = c.params;
    }
    return chosen;
  }

  void reset() override {
    hist_.reset();
    offered_.clear();
    weight_lo_ = weight_hi_ = at::Tensor();
  }

  std::vector<at::Tensor> state() const override { return histogram_observer_state(hist_, shape_); }
  void merge(const std::vector<at::Tensor>& other) override {
    merge_histogram_observer_state(other, 0, hist_, shape_, where_ + ": not an auto state");
    offered_.clear();
  }

 private:
  static std::string short_number(double v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }

  /// Each row evaluated with its own parameters.
  QSpec per_row() const {
    QSpec s = spec_;
    s.per_channel = true;
    s.channel_axis = 0;
    s.group_size = 0;
    return s;
  }

  /// The bins that hold a value in some row: their centres [K] and counts [C, K]. Empty bins
  /// add nothing to a grid error, and activations leave most of the 8192 empty.
  std::pair<at::Tensor, at::Tensor> occupied_bins() const {
    const at::Tensor used = hist_.counts().sum(0).nonzero().reshape({-1});
    return {hist_.centers().index_select(0, used), hist_.counts().index_select(1, used)};
  }

  /// Squared error of the histogram's bin centres on the grid of `p_rows` (per-row
  /// parameters), weighted by the counts: [C].
  at::Tensor grid_error_rows(const QParams& p_rows) const {
    const auto [centers, counts] = occupied_bins();
    const at::Tensor values = centers.unsqueeze(0).expand({hist_.channels(), centers.size(0)});
    const at::Tensor err = fake_quantize(values.to(at::kFloat), p_rows, per_row()).to(at::kDouble) - values;
    return (err * err * counts).sum(1);
  }
  at::Tensor grid_error(const QParams& p) const {
    // Parameters shaped for the observed tensor back to one value per row.
    QParams rows{p.scale.reshape({-1}).to(at::kCPU), p.zero_point.reshape({-1}).to(at::kCPU)};
    if (rows.scale.numel() == 1 && hist_.channels() > 1) {
      rows.scale = rows.scale.expand({hist_.channels()});
      rows.zero_point = rows.zero_point.expand({hist_.channels()});
    }
    return grid_error_rows(rows);
  }

  /// [min, max] * (1 - 0.01 i) with the least grid error, all shrink steps in one call: the
  /// rows repeated once per step, each with its own parameters.
  std::pair<at::Tensor, at::Tensor> mse_range() const {
    const std::int64_t channels = hist_.channels();
    const at::Tensor shrink =
        1.0 - 0.01 * at::arange(kShrinkSteps, at::TensorOptions().dtype(at::kDouble)).unsqueeze(1);  // [S, 1]
    const at::Tensor lo = (shrink * hist_.min().unsqueeze(0)).reshape({-1}),
                     hi = (shrink * hist_.max().unsqueeze(0)).reshape({-1});
    const QParams p = qparams_from_range(lo, hi, per_row(), where_);
    const auto [centers, occupied] = occupied_bins();
    const at::Tensor values = centers.unsqueeze(0).expand({kShrinkSteps * channels, centers.size(0)});
    const at::Tensor err = fake_quantize(values.to(at::kFloat), p, per_row()).to(at::kDouble) - values;
    const at::Tensor counts = occupied.repeat({kShrinkSteps, 1});
    const at::Tensor loss = (err * err * counts).sum(1).reshape({kShrinkSteps, channels});
    const at::Tensor best = loss.argmin(0);  // the first (least shrunk) on ties
    return {lo.reshape({kShrinkSteps, channels}).gather(0, best.unsqueeze(0)).squeeze(0),
            hi.reshape({kShrinkSteps, channels}).gather(0, best.unsqueeze(0)).squeeze(0)};
  }

  /// Each side's alpha tail cut, as the percentile observer does it.
  std::pair<at::Tensor, at::Tensor> percentile_range(double alpha) const {
    const std::int64_t channels = hist_.channels();
    const double total = double(hist_.count_per_channel());
    at::Tensor lo = at::zeros({channels}, at::kDouble), hi = at::zeros({channels}, at::kDouble);
    for (std::int64_t c = 0; c < channels; ++c) {
      const double n_neg = negatives(c), n_pos = total - n_neg;
      if (n_pos > 0) hi[c] = hist_.kth_smallest(c, total - std::max(std::round(n_pos * alpha), 0.0));
      if (n_neg > 0) lo[c] = hist_.kth_smallest(c, std::max(std::round(n_neg * alpha), 1.0));
    }
    return {lo, hi};
  }

  /// Values below 0 in row c, from the bins left of 0 (exact: 0 is a bin edge).
  double negatives(std::int64_t c) const {
    return hist_.counts()[c].narrow(0, 0, hist_.bins() / 2).sum().item<double>();
  }

  static bool same_grid(const QParams& a, const QParams& b) {
    const at::Tensor sa = a.scale.to(at::kDouble), sb = b.scale.to(at::kDouble);
    return at::allclose(sa, sb, 1e-3, 0) && at::equal(a.zero_point.to(at::kLong), b.zero_point.to(at::kLong));
  }

  QSpec spec_;
  std::string where_;
  std::vector<std::int64_t> shape_;  // of the observed tensor, to shape the parameters
  StreamingHistogram hist_{8192, true, false};
  at::Tensor weight_lo_, weight_hi_;
  std::vector<RangeCandidate> offered_;  // candidates() of the statistics as they are
};

void register_all(Registrar& r) { r.add_observer<AutoObserver>("auto"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.auto", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
