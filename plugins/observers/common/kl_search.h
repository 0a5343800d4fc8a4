#pragma once
// TensorRT's entropy search over a histogram of |x|, shared by the kl_histogram and auto
// observers (not part of the SDK). The algorithm is described in kl_histogram.cpp.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "histogram.h"

namespace sparsebit::observers {

/// The search runs on TensorRT's grid, 2,048 bins of |x| over [0, max|x|].
inline constexpr std::int64_t kKlSearchBins = 2048;

/// Number of bins i minimizing KL(P || Q) over `hist` for `levels` levels.
///
/// Within a group Q is flat over the non-empty bins, so the group's share of the divergence
/// follows from prefix sums of h, h log h and the count of non-empty bins:
///   sum_j p_j log(p_j / q) = (S_hlogh - S_h log P - S_h log q) / P   (P = all counts),
/// and each candidate i costs O(levels) instead of O(i) (2048 bins, 128 levels: about 8 times
/// fewer steps). Only bin i-1 is apart: it also holds the tail beyond i.
inline std::int64_t kl_best_bins(const std::vector<double>& hist, std::int64_t levels) {
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

/// Counts of bins of `width` from 0 re-binned onto `bins` bins over [0, amax], each fine bin's
/// count split in proportion to its overlap with the coarse ones (the fine bins are narrower).
inline std::vector<double> rebin_abs(const std::vector<double>& fine, double width, double amax, std::int64_t bins) {
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

/// The entropy threshold of row `c` of `hist` for `levels` levels on one side: the search on
/// its histogram of |x| with exact zeros left out (Note [KL and the zero spike]), re-binned onto
/// kKlSearchBins bins over [0, max|x|] where `rebin` (an activation's power-of-two range), and
/// never below the clipping floor.
inline double entropy_threshold(const StreamingHistogram& hist, std::int64_t c, std::int64_t levels, bool rebin) {
  at::Tensor folded = hist.folded_abs(c).contiguous();
  std::vector<double> h(folded.data_ptr<double>(), folded.data_ptr<double>() + folded.numel());
  h[0] -= hist.zeros()[c].item<double>();
  double width = hist.width();
  if (rebin) {
    const double amax = std::max(-hist.min()[c].item<double>(), hist.max()[c].item<double>());
    h = rebin_abs(h, width, amax, kKlSearchBins);
    width = amax / double(kKlSearchBins);
  }
  // Note [Clipping floor]: a spike near zero must not pull the threshold below it.
  return std::max(double(kl_best_bins(h, levels)) * width, hist.abs_keeping(c, 1 - kMaxClippedFraction));
}

}  // namespace sparsebit::observers
