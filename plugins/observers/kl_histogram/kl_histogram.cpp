// The KL observer: TensorRT's entropy calibration. On the histogram of |x| (Note [Streaming
// histogram], 2048 bins over the observed |x| range at worst), try every clipping bin count
// i from L to the last non-empty bin, where L is the number of quantization levels on one side
// (2^(bits-1), or 2^bits for unsigned data under an affine scheme):
//   P = the first i bins, with everything beyond them added to bin i-1;
//   Q = the first i bins merged into L groups of i/L bins (the last group takes the remainder),
//       each group's total spread evenly over its non-empty bins;
// and keep the i whose KL(P || Q) is smallest (the first on ties). The threshold is the right
// edge of bin i; the range is [-threshold, threshold], or [0, threshold] when nothing observed
// was negative. Empty Q bins where P is not empty get 1e-10 of probability.
//
// Note [KL and the zero spike]
// Values that are exactly 0 (a ReLU's output is half zeros or more) are left out of the
// histogram, as NVIDIA's pytorch-quantization does with skip_zeros. Kept in, they form one spike
// in the first bin; Q spreads each group's total evenly over its non-empty bins, so the wider
// the groups (the larger i), the more of the spike Q moves into the bins beside it, and the
// search ends at a small i whatever the data's shape. On the positive half of a standard normal
// (2048 bins, 8 bits) the spike moved the threshold from 0.86 to 0.37 of the maximum and the
// quantization SNR from 40 dB to 16 dB; on the Fashion-MNIST MobileNet fixture it cost 28 points
// of top-1 (docs/ACCURACY.md). Zero itself is on every grid, so leaving it out loses nothing.

#include <ATen/ATen.h>

#include <numeric>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "histogram.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

/// Number of bins i minimizing KL(P || Q) over `hist` for `levels` levels.
///
/// Within a group Q is flat over the non-empty bins, so the group's share of the divergence
/// follows from prefix sums of h, h log h and the count of non-empty bins:
///   sum_j p_j log(p_j / q) = (S_hlogh - S_h log P - S_h log q) / P   (P = all counts),
/// and each candidate i costs O(levels) instead of O(i) (2048 bins, 128 levels: about 8 times
/// fewer steps). Only bin i-1 is apart: it also holds the tail beyond i.
std::int64_t kl_best_bins(const std::vector<double>& hist, std::int64_t levels) {
  std::int64_t n = static_cast<std::int64_t>(hist.size());
  while (n > 0 && hist[static_cast<std::size_t>(n - 1)] == 0) --n;
  if (n <= levels) return n;
  const auto un = static_cast<std::size_t>(n);
  std::vector<double> sum_h(un + 1, 0.0), sum_hlogh(un + 1, 0.0), nonzero(un + 1, 0.0);
  for (std::size_t j = 0; j < un; ++j) {
    const double h = hist[j];
    sum_h[j + 1] = sum_h[j] + h;
    sum_hlogh[j + 1] = sum_hlogh[j] + (h > 0 ? h * std::log(h) : 0.0);
    nonzero[j + 1] = nonzero[j] + (h != 0 ? 1.0 : 0.0);
  }
  const double total = sum_h[un], log_total = std::log(total);
  std::vector<double> score(static_cast<std::size_t>(n - levels + 1));
  at::parallel_for(levels, n + 1, 64, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t merged = i / levels;
      const double q_sum = sum_h[static_cast<std::size_t>(i)];  // empty groups add nothing to Q
      double kl = 0;
      for (std::int64_t g = 0; g < levels; ++g) {
        const auto start = static_cast<std::size_t>(g * merged);
        const auto stop = static_cast<std::size_t>(g == levels - 1 ? i : g * merged + merged);
        const double h_g = sum_h[stop] - sum_h[start], nz_g = nonzero[stop] - nonzero[start];
        if (nz_g == 0) continue;  // then every p in it is 0 too (bin i-1 is handled below)
        const double log_q = std::log(h_g / nz_g / q_sum);
        // The group's bins except i-1.
        const auto last = std::min(stop, static_cast<std::size_t>(i - 1));
        if (last > start) {
          const double s_h = sum_h[last] - sum_h[start], s_hlogh = sum_hlogh[last] - sum_hlogh[start];
          kl += (s_hlogh - s_h * log_total - s_h * log_q) / total;
        }
      }
      // Bin i-1 with the tail folded in; its Q is its group's level, or 1e-10 if it is empty.
      const auto b = static_cast<std::size_t>(i - 1);
      const double p = (hist[b] + (total - sum_h[b + 1])) / total;
      if (p > 0) {
        double qq = 1e-10;
        if (hist[b] != 0) {
          const std::int64_t g = std::min((i - 1) / merged, levels - 1);
          const auto start = static_cast<std::size_t>(g * merged);
          qq = (sum_h[b + 1] - sum_h[start]) / (nonzero[b + 1] - nonzero[start]) / q_sum;
        }
        kl += p * std::log(p / qq);
      }
      score[static_cast<std::size_t>(i - levels)] = kl;
    }
  });
  // The smallest in order (the first on ties), as a sequential search would take it.
  double best = std::numeric_limits<double>::infinity();
  std::int64_t best_i = n;
  for (std::int64_t i = levels; i <= n; ++i)
    if (score[static_cast<std::size_t>(i - levels)] < best) {
      best = score[static_cast<std::size_t>(i - levels)];
      best_i = i;
    }
  return best_i;
}

class KlHistogramObserver final : public Observer {
 public:
  explicit KlHistogramObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {}

  // One histogram per channel: each channel's bins span its own range, so a small channel
  // next to a large one keeps its full resolution.
  void observe(const at::Tensor& x) override {
    if (x.numel() == 0) return;
    shape_.assign(x.sizes().begin(), x.sizes().end());
    at::Tensor rows = channels_first(x.detach().to(at::kFloat), spec_);
    if (hists_.empty()) hists_.assign(static_cast<std::size_t>(rows.size(0)), histogram());
    if (hists_.size() != static_cast<std::size_t>(rows.size(0)))
      throw Error(where_ + ": the channel count changed between batches");
    for (std::int64_t c = 0; c < rows.size(0); ++c) hists_[static_cast<std::size_t>(c)].add(rows.narrow(0, c, 1));
  }

  QParams compute() override {
    if (hists_.empty()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
    const auto channels = static_cast<std::int64_t>(hists_.size());
    at::Tensor lo = at::zeros({channels}, at::kDouble), hi = at::zeros({channels}, at::kDouble);
    for (std::int64_t c = 0; c < channels; ++c) {
      const StreamingHistogram& hist = hists_[static_cast<std::size_t>(c)];
      const bool has_negative = hist.min()[0].item<double>() < 0;
      const std::int64_t levels =
          (!spec_.symmetric && !has_negative) ? (std::int64_t{1} << spec_.bits) : (std::int64_t{1} << (spec_.bits - 1));
      at::Tensor folded = hist.folded_abs(0).contiguous();
      std::vector<double> h(folded.data_ptr<double>(), folded.data_ptr<double>() + folded.numel());
      h[0] -= hist.zeros()[0].item<double>();  // Note [KL and the zero spike]
      double width = hist.width();
      if (!spec_.is_weight) {
        const double amax = std::max(-hist.min()[0].item<double>(), hist.max()[0].item<double>());
        h = rebin(h, width, amax, kSearchBins);
        width = amax / double(kSearchBins);
      }
      const double threshold = double(kl_best_bins(h, levels)) * width;
      hi[c] = threshold;
      lo[c] = has_negative ? -threshold : 0.0;
    }
    return range_qparams(lo, hi, spec_, where_, shape_);
  }

  void reset() override { hists_.clear(); }

  // [shape], then the six tensors of each channel's histogram.
  bool mergeable() const override { return true; }
  std::vector<at::Tensor> state() const override {
    if (hists_.empty()) return {};
    std::vector<at::Tensor> s{shape_state(shape_)};
    for (const auto& h : hists_)
      for (auto& t : h.state()) s.push_back(t);
    return s;
  }
  void merge(const std::vector<at::Tensor>& other) override {
    if (other.empty()) return;
    if (other.size() < 7 || (other.size() - 1) % 6 != 0) throw Error(where_ + ": not a kl_histogram state");
    const std::size_t channels = (other.size() - 1) / 6;
    if (hists_.empty()) hists_.assign(channels, histogram());
    if (hists_.size() != channels) throw Error(where_ + ": merging states of different channel counts");
    shape_ = shape_from_state(other[0]);
    for (std::size_t c = 0; c < channels; ++c) hists_[c].merge({other.begin() + 1 + 6 * c, other.begin() + 7 + 6 * c});
  }

 private:
  /// The search runs on TensorRT's grid, 2,048 bins of |x| over [0, max|x|].
  static constexpr std::int64_t kSearchBins = 2048;

  /// Counts of bins of `width` from 0 re-binned onto `bins` bins over [0, amax], each fine bin's
  /// count split in proportion to its overlap with the coarse ones (the fine bins are narrower).
  static std::vector<double> rebin(const std::vector<double>& fine, double width, double amax, std::int64_t bins) {
    std::vector<double> out(static_cast<std::size_t>(bins), 0.0);
    if (!(amax > 0)) {
      out[0] = std::accumulate(fine.begin(), fine.end(), 0.0);
      return out;
    }
    const double coarse = amax / double(bins);
    for (std::size_t j = 0; j < fine.size(); ++j) {
      if (fine[j] == 0) continue;
      const double a = double(j) * width, b = a + width;
      auto first = static_cast<std::int64_t>(a / coarse), last = static_cast<std::int64_t>(b / coarse);
      first = std::min(first, bins - 1);
      last = std::min(last, bins - 1);
      for (std::int64_t k = first; k <= last; ++k) {
        const double lo = std::max(a, double(k) * coarse), hi = k == bins - 1 ? b : std::min(b, double(k + 1) * coarse);
        if (hi > lo) out[static_cast<std::size_t>(k)] += fine[j] * (hi - lo) / width;
      }
    }
    return out;
  }

  // A weight's histogram spans exactly its range in 4,096 bins (2,048 of |x|, as TensorRT's);
  // an activation's spans a power of two (Note [Streaming histogram]) in 8,192, so that at
  // least 2,048 bins of |x| still cover its range.
  StreamingHistogram histogram() const {
    return spec_.is_weight ? StreamingHistogram(4096, false) : StreamingHistogram(8192);
  }

  QSpec spec_;
  std::string where_;
  std::vector<std::int64_t> shape_;  // of the observed tensor, to shape the parameters
  std::vector<StreamingHistogram> hists_;
};

void register_all(Registrar& r) { r.add_observer<KlHistogramObserver>("kl_histogram"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.kl_histogram", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
