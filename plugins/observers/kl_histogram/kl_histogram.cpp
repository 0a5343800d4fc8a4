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

#include <vector>

#include "histogram.h"
#include "kl_search.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

class KlHistogramObserver final : public Observer, public MergeableObserver {
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
      const double threshold = entropy_threshold(hist, 0, levels, !spec_.is_weight);
      hi[c] = threshold;
      lo[c] = has_negative ? -threshold : 0.0;
    }
    return range_qparams(lo, hi, spec_, where_, shape_);
  }

  void reset() override { hists_.clear(); }

  // [shape], then the six tensors of each channel's histogram.
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
