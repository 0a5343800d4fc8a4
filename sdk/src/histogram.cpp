// histogram_counts (sparsebit/sdk/quant.h): the histogram observers' bin counts, on a device's
// kernels where they have them, else on the CPU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

namespace {
// Bin of each of x[0..len): floor((double(x) + range) / width) clamped to [0, last]; NaN -> 0.
// `inverse` (1 / width, or 0): where width is a power of two, dividing by it and multiplying by
// its inverse give the same double, and the multiplication is several times faster.
void bin_indices_scalar(const float* x, std::int64_t len, double range, double width, double inverse, double last,
                        std::int32_t* out) {
  for (std::int64_t i = 0; i < len; ++i) {
    double b = std::floor(inverse != 0 ? (double(x[i]) + range) * inverse : (double(x[i]) + range) / width);
    b = b >= 0 ? b : 0;  // also NaN
    b = b <= last ? b : last;
    out[i] = static_cast<std::int32_t>(b);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same, four doubles at a time (the compiler leaves the scalar loop scalar: 1.4 ns an
// element against 0.35). Division and floor are exact in both, so the bins are the same.
__attribute__((target("avx2"))) void bin_indices_avx2(const float* x, std::int64_t len, double range, double width,
                                                      double inverse, double last, std::int32_t* out) {
  const __m256d r = _mm256_set1_pd(range), w = _mm256_set1_pd(width), inv = _mm256_set1_pd(inverse),
                zero = _mm256_setzero_pd(), top = _mm256_set1_pd(last);
  std::int64_t i = 0;
  for (; i + 4 <= len; i += 4) {
    const __m256d shifted = _mm256_add_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), r);
    __m256d b = _mm256_floor_pd(inverse != 0 ? _mm256_mul_pd(shifted, inv) : _mm256_div_pd(shifted, w));
    b = _mm256_min_pd(_mm256_max_pd(b, zero), top);  // max_pd gives its second operand for NaN
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvttpd_epi32(b));
  }
  bin_indices_scalar(x + i, len - i, range, width, inverse, last, out + i);
}
#endif

void bin_indices(const float* x, std::int64_t len, double range, double width, double inverse, double last,
                 std::int32_t* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return bin_indices_avx2(x, len, range, width, inverse, last, out);
#endif
  bin_indices_scalar(x, len, range, width, inverse, last, out);
}

// histogram_counts on the CPU: the same double arithmetic as the ATen formulation below, whose
// nine full-size temporaries (double, int64) made histogram observers 5 to 12 times slower than
// minmax. Each task counts a run of one row into its own bins; counts are integers, so adding
// the tasks' bins in any order gives the same result.
at::Tensor cpu_histogram_counts(const at::Tensor& rows_in, double range, double width, std::int64_t bins) {
  const at::Tensor rows = rows_in.contiguous();
  const std::int64_t channels = rows.size(0), n = rows.size(1);
  at::Tensor counts = at::zeros({channels, bins}, at::kLong);
  const float* data = rows.data_ptr<float>();
  std::int64_t* out = counts.data_ptr<std::int64_t>();
  constexpr std::int64_t kRun = std::int64_t{1} << 16, kBlock = 512;
  const std::int64_t runs = (n + kRun - 1) / kRun;
  int exponent = 0;
  const double inverse = std::frexp(width, &exponent) == 0.5 ? 1.0 / width : 0.0;
  std::mutex merge;
  at::parallel_for(0, channels * runs, 1, [&](std::int64_t t0, std::int64_t t1) {
    // Four interleaved 32-bit histograms: activations crowd into few bins, and one array's
    // increments of the same bin wait on each other. Flushed before 32 bits could overflow.
    std::vector<std::uint32_t> local(static_cast<std::size_t>(4 * bins));
    std::int32_t idx[kBlock];
    for (std::int64_t t = t0; t < t1;) {
      const std::int64_t c = t / runs;
      std::int64_t pending = 0;
      auto flush = [&] {
        std::lock_guard<std::mutex> lock(merge);
        for (std::int64_t j = 0; j < bins; ++j) {
          const std::size_t k = static_cast<std::size_t>(j);
          out[c * bins + j] += std::int64_t(local[k]) + std::int64_t(local[k + bins]) +
                               std::int64_t(local[k + 2 * bins]) + std::int64_t(local[k + 3 * bins]);
        }
        std::fill(local.begin(), local.end(), 0u);
        pending = 0;
      };
      for (; t < t1 && t / runs == c; ++t) {  // this task's runs of row c
        const std::int64_t first = (t % runs) * kRun, last = std::min(first + kRun, n);
        if (pending > (std::int64_t{1} << 31)) flush();
        pending += last - first;
        for (std::int64_t i = first; i < last; i += kBlock) {
          const std::int64_t len = std::min(kBlock, last - i);
          bin_indices(data + c * n + i, len, range, width, inverse, double(bins - 1), idx);
          std::int64_t j = 0;
          for (; j + 4 <= len; j += 4) {
            ++local[static_cast<std::size_t>(idx[j])];
            ++local[static_cast<std::size_t>(bins + idx[j + 1])];
            ++local[static_cast<std::size_t>(2 * bins + idx[j + 2])];
            ++local[static_cast<std::size_t>(3 * bins + idx[j + 3])];
          }
          for (; j < len; ++j) ++local[static_cast<std::size_t>(idx[j])];
        }
      }
      flush();
    }
  });
  return counts;
}
}  // namespace

at::Tensor histogram_counts(const at::Tensor& rows, double range, std::int64_t bins) {
  if (rows.dim() != 2) throw Error("histogram_counts: rows must be [C, N], got shape " + c10::str(rows.sizes()));
  if (bins < 2 || !(range > 0)) throw Error("histogram_counts: needs bins >= 2 and range > 0");
  if (rows.scalar_type() == at::kFloat && rows.numel() > 0)
    if (QuantKernels* k = quant_kernels(rows.device().type()))
      return k->histogram_counts(rows.contiguous(), range, bins);
  const std::int64_t channels = rows.size(0);
  const double width = 2 * range / double(bins);
  if (rows.device().is_cpu() && rows.scalar_type() == at::kFloat && bins <= std::numeric_limits<std::int32_t>::max())
    return cpu_histogram_counts(rows, range, width, bins);
  at::Tensor idx = at::floor((rows.detach().to(at::kDouble) + range) / width).clamp(0, bins - 1).to(at::kLong);
  idx = idx + at::arange(channels, idx.options()).unsqueeze(1) * bins;
  return at::bincount(idx.reshape({-1}), {}, channels * bins).reshape({channels, bins});
}

}  // namespace sparsebit
