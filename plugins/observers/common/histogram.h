#pragma once
// A streaming histogram shared by the histogram-based observers of this repository (not part
// of the SDK).
//
// Note [Streaming histogram]
// Counts live in B bins (B even) over a symmetric range [-R, R], one row per channel. For
// activations R is a power of two, the smallest above max|x|; when a batch reaches R, R doubles and every pair of
// bins merges exactly into one bin of the new grid (bin 2m and 2m+1 become bin B/4 + m), so no
// count is ever smeared and memory stays C x B whatever the number of samples. Because R is a
// power of two, the final grid depends only on the largest |x| seen, never on the order of the
// batches: histograms of parts of the data (several processes, Note [Distributed observers])
// merge into exactly the counts of one histogram of all of it (for power-of-two B, where bin
// edges are exact). The resolution is at worst B/4 bins over the final [-max|x|, max|x|]. A
// weight, observed once, keeps R = max|x| (all B bins over its range).
// Exact per-channel minimum, maximum, sum, count and number of exact zeros are kept beside it
// (the zeros sit in the bin right of 0; see Note [KL and the zero spike]).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit::observers {

/// Note [Clipping floor]
/// Observers that fit a model to the data (kl_histogram's entropy search, aciq's distribution
/// tables) can clip far into a tail that matters. The entropy search compares the shapes of
/// distributions, not how far clipped values move: exact zeros are left out of it (Note [KL and
/// the zero spike]), but a spike just off zero (a residual sum, a Hardswish's small negatives,
/// a near-idle channel) stays in the first bin and pulls the threshold down whatever the tail
/// holds. aciq's Gaussian sigma comes from the range, which says little about data that is not
/// Gaussian. On PP-OCRv4's recognizer each clipped inputs to 11%-50% of the range that
/// minimizes their squared error, and exact-match fell from 99.5% (FP32) to 0% (docs/ACCURACY.md).
/// Their thresholds (aciq's: of activations) are therefore never below the one that keeps all but
/// kMaxClippedFraction of the non-zero values (the percentile observer's default alpha, on |x|):
/// clipping 0.1% of the values was the most that any measured model rewarded (the recognizer
/// itself: 98% with the percentile observer).
inline constexpr double kMaxClippedFraction = 1e-3;

class StreamingHistogram {
 public:
  /// `order_free`: ranges are powers of two (Note [Streaming histogram]), so parts of the data
  /// merge exactly; otherwise the first range is the first batch's max |x| (a tensor observed
  /// once, such as a weight, then gets all B bins over exactly [-max|x|, max|x|]).
  /// `moments`: also keep each row's sum and count of exact zeros (sum() and zeros(); zero
  /// otherwise), a pass over the data that observers not using them skip.
  explicit StreamingHistogram(std::int64_t bins = 4096, bool order_free = true, bool moments = true)
      : bins_(bins), order_free_(order_free), moments_(moments) {}

  /// x: [C, N] (rows are channels; per tensor: C = 1).
  void add(const at::Tensor& x_in) {
    at::Tensor x = x_in.detach().to(at::kFloat);
    if (x.size(1) == 0) return;
    const bool first = !counts_.defined();
    const std::int64_t channels = x.size(0);
    at::Tensor lo, hi, sum, zeros;
    if (!moments_) {
      if (channels == 1) {
        std::tie(lo, hi) = at::aminmax(x);  // over the whole tensor: see cpu_row_stats
        lo = lo.reshape({1});
        hi = hi.reshape({1});
      } else {
        std::tie(lo, hi) = at::aminmax(x, 1);
      }
      lo = lo.to(at::kCPU, at::kDouble);
      hi = hi.to(at::kCPU, at::kDouble);
      sum = at::zeros({channels}, at::TensorOptions().dtype(at::kDouble));
      zeros = at::zeros({channels}, at::TensorOptions().dtype(at::kDouble));
    } else if (x.device().is_cpu()) {
      std::tie(lo, hi, sum, zeros) = cpu_row_stats(x.contiguous());
    } else {
      std::tie(lo, hi) = at::aminmax(x, 1);
      lo = lo.to(at::kCPU, at::kDouble);
      hi = hi.to(at::kCPU, at::kDouble);
      sum = x.to(at::kDouble).sum(1).to(at::kCPU);
      zeros = (x == 0).sum(1).to(at::kCPU, at::kDouble);
    }
    if (!counts_.defined()) {
      counts_ = at::zeros({channels, bins_}, at::TensorOptions().dtype(at::kDouble));
      min_ = lo;
      max_ = hi;
      sum_ = sum;
      zeros_ = zeros;
    } else {
      if (channels != counts_.size(0))
        throw Error("the channel count changed between batches (" + std::to_string(counts_.size(0)) + " then " +
                    std::to_string(channels) + ")");
      min_ = at::minimum(min_, lo);
      max_ = at::maximum(max_, hi);
      sum_ += sum;
      zeros_ += zeros;
    }
    count_ += x.size(1);
    const double amax = std::max(-lo.min().item<double>(), hi.max().item<double>());
    if (!std::isfinite(amax)) throw Error("the data contains NaN or Inf");
    if (!order_free_) {
      if (range_ == 0) range_ = amax > 0 ? amax : 1e-12;
      while (amax > range_) grow();
    } else if (range_ == 0) {
      range_ = std::ldexp(1.0, kSmallestRangeExponent);
    }
    if (order_free_ && amax >= range_) {
      int e = 0;
      std::frexp(amax, &e);  // amax < 2^e <= 2 amax
      if (first) range_ = std::ldexp(1.0, e);
      while (range_ < std::ldexp(1.0, e)) grow();
    }
    // Bin index of each value; the right edge R belongs to the last bin.
    counts_ += histogram_counts(x, range_, bins_).to(at::kCPU, at::kDouble);
  }

  bool empty() const { return !counts_.defined(); }
  std::int64_t bins() const { return bins_; }
  std::int64_t channels() const { return counts_.size(0); }
  double range() const { return range_; }
  double width() const { return 2 * range_ / double(bins_); }
  /// [C, B] double counts on the CPU.
  const at::Tensor& counts() const { return counts_; }
  /// Bin centres, [B].
  at::Tensor centers() const {
    return (at::arange(bins_, at::TensorOptions().dtype(at::kDouble)) + 0.5) * width() - range_;
  }
  const at::Tensor& min() const { return min_; }
  const at::Tensor& max() const { return max_; }
  const at::Tensor& sum() const { return sum_; }
  /// Per channel, how many values were exactly 0 (double, [C]).
  const at::Tensor& zeros() const { return zeros_; }
  std::int64_t count_per_channel() const { return count_; }

  /// The k-th smallest value (1-based) of channel c, interpolated linearly inside its bin.
  double kth_smallest(std::int64_t c, double k) const {
    const at::Tensor counts = counts_[c].contiguous();
    auto row = counts.accessor<double, 1>();
    double before = 0;
    for (std::int64_t j = 0; j < bins_; ++j) {
      if (before + row[j] >= k && row[j] > 0) {
        const double frac = (k - before) / row[j];
        return std::clamp(-range_ + width() * (double(j) + frac), min_[c].item<double>(), max_[c].item<double>());
      }
      before += row[j];
    }
    return max_[c].item<double>();
  }

  /// The smallest t at a bin edge such that at least `keep` of channel c's non-zero values
  /// have |x| <= t (within a bin of the exact quantile), capped at max |x|.
  double abs_keeping(std::int64_t c, double keep) const {
    const at::Tensor folded = folded_abs(c).contiguous();
    const double* h = folded.data_ptr<double>();
    const std::int64_t half = bins_ / 2;
    const double zeros = zeros_[c].item<double>();
    const double total = folded.sum().item<double>() - zeros;
    const double amax = std::max(-min_[c].item<double>(), max_[c].item<double>());
    if (!(total > 0)) return amax;
    double kept = -zeros;  // the exact zeros sit in the first bin of |x|
    for (std::int64_t j = 0; j < half; ++j) {
      kept += h[j];
      if (kept >= keep * total) return std::min(amax, double(j + 1) * width());
    }
    return amax;
  }

  /// |x| histogram of channel c: B/2 bins over [0, R] (bins are symmetric around 0).
  at::Tensor folded_abs(std::int64_t c) const {
    const std::int64_t half = bins_ / 2;
    at::Tensor row = counts_[c];
    return row.narrow(0, half, half) + row.narrow(0, 0, half).flip(0);
  }

  /// Everything above as tensors (Note [Distributed observers]); empty when nothing was added.
  std::vector<at::Tensor> state() const {
    if (empty()) return {};
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor meta = at::tensor({range_, double(count_), double(bins_)}, opts);
    return {counts_, min_, max_, sum_, zeros_, meta};
  }

  /// Adds another histogram's state(): the finer grid grows to the coarser one's range, then
  /// counts add bin by bin.
  void merge(const std::vector<at::Tensor>& other) {
    if (other.empty()) return;
    if (other.size() != 6 || other[5].numel() != 3) throw Error("not the state of a streaming histogram");
    const at::Tensor meta = other[5].to(at::kCPU, at::kDouble);
    const double range = meta[0].item<double>();
    if (std::int64_t(meta[2].item<double>()) != bins_)
      throw Error("histograms of " + std::to_string(bins_) + " and " +
                  std::to_string(std::int64_t(meta[2].item<double>())) + " bins cannot be merged");
    at::Tensor counts = other[0].to(at::kCPU, at::kDouble);
    if (empty()) {
      counts_ = counts.clone();
      min_ = other[1].to(at::kCPU, at::kDouble).clone();
      max_ = other[2].to(at::kCPU, at::kDouble).clone();
      sum_ = other[3].to(at::kCPU, at::kDouble).clone();
      zeros_ = other[4].to(at::kCPU, at::kDouble).clone();
      range_ = range;
      count_ = std::int64_t(meta[1].item<double>());
      return;
    }
    if (counts.size(0) != counts_.size(0))
      throw Error("histograms of " + std::to_string(counts_.size(0)) + " and " + std::to_string(counts.size(0)) +
                  " channels cannot be merged");
    while (range_ < range) grow();
    for (double r = range; r < range_; r *= 2) counts = merged_pairs(counts);
    counts_ += counts;
    min_ = at::minimum(min_, other[1].to(at::kCPU, at::kDouble));
    max_ = at::maximum(max_, other[2].to(at::kCPU, at::kDouble));
    sum_ += other[3].to(at::kCPU, at::kDouble);
    zeros_ += other[4].to(at::kCPU, at::kDouble);
    count_ += std::int64_t(meta[1].item<double>());
  }

  void reset() {
    counts_ = at::Tensor();
    min_ = max_ = sum_ = zeros_ = at::Tensor();
    count_ = 0;
    range_ = 0;
  }

 private:
  /// Sum and number of zeros of p[0..len). Four partial sums (one dependency chain per lane,
  /// not one for the whole run) let the compiler keep them in a vector register.
  static void sum_and_zeros(const float* p, std::int64_t len, double& sum, std::int64_t& zeros) {
    double part[4] = {0, 0, 0, 0};
    std::int64_t i = 0;
    for (; i + 4 <= len; i += 4)
      for (int j = 0; j < 4; ++j) part[j] += double(p[i + j]);
    for (; i < len; ++i) part[0] += double(p[i]);
    std::int32_t z = 0;
    for (std::int64_t k = 0; k < len; ++k) z += p[k] == 0.0f;
    sum = (part[0] + part[1]) + (part[2] + part[3]);
    zeros = z;
  }

  /// Per row of a contiguous float [C, N]: minimum, maximum, sum and count of zeros, as double
  /// [C] tensors. The range comes from ATen's reduction (over the whole tensor when it is one
  /// row: 18 times faster than over dim 1); the sum and zeros from one pass over chunks of
  /// fixed size, added in order, so the sum does not depend on the thread count. (Four ATen
  /// reductions, one through a double copy, took longer than the histogram.)
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cpu_row_stats(const at::Tensor& x) {
    const std::int64_t rows = x.size(0), n = x.size(1);
    at::Tensor lo, hi;
    if (rows == 1) {
      std::tie(lo, hi) = at::aminmax(x);
      lo = lo.reshape({1});
      hi = hi.reshape({1});
    } else {
      std::tie(lo, hi) = at::aminmax(x, 1);
    }
    constexpr std::int64_t kChunk = std::int64_t{1} << 16;
    const std::int64_t per_row = (n + kChunk - 1) / kChunk;
    std::vector<double> sums(static_cast<std::size_t>(rows * per_row));
    std::vector<std::int64_t> zeros(sums.size());
    const float* data = x.data_ptr<float>();
    at::parallel_for(0, rows * per_row, 1, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t r = t / per_row, k = t % per_row;
        sum_and_zeros(data + r * n + k * kChunk, std::min(kChunk, n - k * kChunk), sums[static_cast<std::size_t>(t)],
                      zeros[static_cast<std::size_t>(t)]);
      }
    });
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor sum = at::zeros({rows}, opts), zero = at::zeros({rows}, opts);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t k = 0; k < per_row; ++k) {
        sum.data_ptr<double>()[r] += sums[static_cast<std::size_t>(r * per_row + k)];
        zero.data_ptr<double>()[r] += double(zeros[static_cast<std::size_t>(r * per_row + k)]);
      }
    return {lo.to(at::kDouble), hi.to(at::kDouble), sum, zero};
  }

  /// The counts of `counts` on the grid of twice its range.
  at::Tensor merged_pairs(const at::Tensor& counts) const {
    const std::int64_t c = counts.size(0), half = bins_ / 2;
    at::Tensor merged = counts.reshape({c, half, 2}).sum(2);
    at::Tensor out = at::zeros_like(counts);
    out.narrow(1, bins_ / 4, half).copy_(merged);
    return out;
  }

  void grow() {
    counts_ = merged_pairs(counts_);
    range_ *= 2;
  }

  /// The first range: 2^-40, below any activation worth a scale; all-zero data keeps it.
  static constexpr int kSmallestRangeExponent = -40;

  std::int64_t bins_;
  bool order_free_;
  bool moments_;
  double range_ = 0;
  std::int64_t count_ = 0;
  at::Tensor counts_, min_, max_, sum_, zeros_;
};

/// A shape as a tensor and back, for observers' state() (Note [Distributed observers]).
inline at::Tensor shape_state(const std::vector<std::int64_t>& shape) {
  return at::tensor(at::ArrayRef<std::int64_t>(shape), at::TensorOptions().dtype(at::kLong));
}
inline std::vector<std::int64_t> shape_from_state(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<std::int64_t>(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel());
}

/// The state() of an observer built on a StreamingHistogram (Note [Distributed observers]): the
/// histogram's, the observed tensor's shape, then the observer's own `extra` tensors.
inline std::vector<at::Tensor> histogram_observer_state(const StreamingHistogram& hist,
                                                        const std::vector<std::int64_t>& shape,
                                                        const std::vector<at::Tensor>& extra = {}) {
  if (hist.empty()) return {};
  auto s = hist.state();
  s.push_back(shape_state(shape));
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}

/// Merges such a state with `extras` extra tensors into `hist` and `shape` and returns the
/// extras (none for an empty state); another size is an error naming `what`.
inline std::vector<at::Tensor> merge_histogram_observer_state(const std::vector<at::Tensor>& other, std::size_t extras,
                                                              StreamingHistogram& hist,
                                                              std::vector<std::int64_t>& shape,
                                                              const std::string& what) {
  if (other.empty()) return {};
  if (other.size() != 7 + extras) throw Error(what);
  hist.merge({other.begin(), other.begin() + 6});
  shape = shape_from_state(other[6]);
  return {other.begin() + 7, other.end()};
}

/// QParams of per-row ranges (rows of quant_rows for a tensor of `shape`).
inline QParams range_qparams(const at::Tensor& lo, const at::Tensor& hi, const QSpec& spec, const std::string& where,
                             const std::vector<std::int64_t>& shape) {
  return qparams_from_range(rows_to_params(lo, shape, spec), rows_to_params(hi, shape, spec), spec, where);
}

/// x as rows of what one scale covers (quant_rows), validating a per-channel axis.
inline at::Tensor channels_first(const at::Tensor& x, const QSpec& spec) {
  if (spec.per_channel && spec.group_size == 0) {
    const std::int64_t a = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
    if (a < 0 || a >= x.dim())
      throw Error("channel axis " + std::to_string(spec.channel_axis) + " does not exist in a tensor of shape " +
                  c10::str(x.sizes()));
  }
  return quant_rows(x, spec);
}

}  // namespace sparsebit::observers
