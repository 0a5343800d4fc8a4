#pragma once
// The error of one layer's outputs against float, relative per slice (not part of the public
// headers): shared by the range selection and the accuracy target's remedies.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace sparsebit::detail {

/// Note [Relative layer error]
/// A candidate's error at a node is the squared error of each floating output relative to the
/// float output's energy, per slice along dim 1 (channels of an NCHW output, tokens of an
/// [N, T, C] one), summed over the slices. Absolute error lets large channels decide alone,
/// while normalization layers and the next weights rescale every channel: measured on PP-OCRv4's
/// recognizer, 90.5% exact-match with the absolute error against 99.0% with the relative one.
struct Reference {
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> energy;  ///< per output: [slices] float energy (undefined: not compared)
};

/// [N, S, rest] view of t, with S = dim 1 (1 for tensors of rank below 2).
inline at::Tensor slices(const at::Tensor& t) {
  if (t.dim() < 2) return t.reshape({1, 1, -1});
  return t.reshape({t.size(0), t.size(1), -1});
}

/// Sum of d^2 over a run, d = a - b (a alone when b is null), non-finite d counted as 0; float
/// squares added in blocks of 256, the blocks in double.
inline double run_squares_scalar(const float* a, const float* b, std::int64_t len) {
  double total = 0;
  for (std::int64_t i = 0; i < len; i += 256) {
    float block = 0;
    for (std::int64_t k = i, end = std::min(len, i + 256); k < end; ++k) {
      const float d = b ? a[k] - b[k] : a[k];
      block += std::isfinite(d) ? d * d : 0.f;
    }
    total += block;
  }
  return total;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) inline double run_squares_avx2(const float* a, const float* b, std::int64_t len) {
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 sign = _mm256_set1_ps(-0.0f);
  double total = 0;
  std::int64_t i = 0;
  for (; i + 256 <= len; i += 256) {
    __m256 acc = _mm256_setzero_ps();
    for (std::int64_t k = i; k < i + 256; k += 8) {
      __m256 d = _mm256_loadu_ps(a + k);
      if (b) d = _mm256_sub_ps(d, _mm256_loadu_ps(b + k));
      const __m256 finite = _mm256_cmp_ps(_mm256_andnot_ps(sign, d), inf, _CMP_LT_OQ);  // false for NaN, Inf
      d = _mm256_and_ps(d, finite);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    total +=
        double((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + double((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
  return total + run_squares_scalar(a + i, b ? b + i : nullptr, len - i);
}
#endif

inline double run_squares(const float* a, const float* b, std::int64_t len) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return run_squares_avx2(a, b, len);
#endif
  return run_squares_scalar(a, b, len);
}

/// acc[j] += d_j^2 for one row of c values, d = x - y (x alone when y is null), non-finite d as 0.
inline void add_row_squares_scalar(float* acc, const float* x, const float* y, std::int64_t c) {
  for (std::int64_t j = 0; j < c; ++j) {
    const float d = y ? x[j] - y[j] : x[j];
    acc[j] += std::isfinite(d) ? d * d : 0.f;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) inline void add_row_squares_avx2(float* acc, const float* x, const float* y,
                                                                 std::int64_t c) {
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity()), sign = _mm256_set1_ps(-0.0f);
  std::int64_t j = 0;
  for (; j + 8 <= c; j += 8) {
    __m256 d = _mm256_loadu_ps(x + j);
    if (y) d = _mm256_sub_ps(d, _mm256_loadu_ps(y + j));
    d = _mm256_and_ps(d, _mm256_cmp_ps(_mm256_andnot_ps(sign, d), inf, _CMP_LT_OQ));  // 0 for NaN, Inf
    _mm256_storeu_ps(acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), _mm256_mul_ps(d, d)));
  }
  add_row_squares_scalar(acc + j, x + j, y ? y + j : nullptr, c - j);
}
#endif

inline void add_row_squares(float* acc, const float* x, const float* y, std::int64_t c) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return add_row_squares_avx2(acc, x, y, c);
#endif
  add_row_squares_scalar(acc, x, y, c);
}

/// slice_squares of 4-d tensors laid out channels last (what convolutions return here), read in
/// place: rows of C values, each chunk of rows summed per channel in float, the chunks in order.
inline at::Tensor channels_last_squares(const at::Tensor& a, const at::Tensor& b) {
  const std::int64_t c = a.size(1), rows = a.numel() / std::max<std::int64_t>(1, c);
  constexpr std::int64_t kChunk = 64;
  const std::int64_t chunks = (rows + kChunk - 1) / kChunk;
  std::vector<double> parts(static_cast<std::size_t>(chunks * c));
  const float* pa = a.data_ptr<float>();
  const float* pb = b.defined() ? b.data_ptr<float>() : nullptr;
  at::parallel_for(0, chunks, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, kChunk * c)),
                   [&](std::int64_t k0, std::int64_t k1) {
                     std::vector<float> acc(static_cast<std::size_t>(c));
                     for (std::int64_t k = k0; k < k1; ++k) {
                       std::fill(acc.begin(), acc.end(), 0.f);
                       for (std::int64_t r = k * kChunk, end = std::min(rows, r + kChunk); r < end; ++r)
                         add_row_squares(acc.data(), pa + r * c, pb ? pb + r * c : nullptr, c);
                       std::copy(acc.begin(), acc.end(), parts.begin() + k * c);
                     }
                   });
  at::Tensor out = at::zeros({c}, at::TensorOptions().dtype(at::kDouble));
  double* po = out.data_ptr<double>();
  for (std::int64_t k = 0; k < chunks; ++k)
    for (std::int64_t j = 0; j < c; ++j) po[j] += parts[static_cast<std::size_t>(k * c + j)];
  return out;
}

/// Per slice of [N, S, rest] views: the sum over n and rest of d^2, d = a - b (a alone when b
/// is undefined) with non-finite d counted as 0, as double. On the CPU in one pass (the ATen
/// formulation's four full-size temporaries cost the range selection ten times the layer's own
/// run), each slice summed in a fixed order, so the result does not depend on the thread count.
inline at::Tensor slice_squares(const at::Tensor& a_in, const at::Tensor& b_in) {
  const bool cpu = a_in.device().is_cpu() && a_in.scalar_type() == at::kFloat &&
                   (!b_in.defined() || (b_in.device().is_cpu() && b_in.scalar_type() == at::kFloat));
  if (!cpu) {
    const at::Tensor d = slices((b_in.defined() ? a_in - b_in : a_in).nan_to_num(0, 0, 0));
    return d.mul(d).sum(at::IntArrayRef{0, 2}, false, at::kDouble).cpu();
  }
  if (a_in.dim() == 4 && !a_in.is_contiguous() && a_in.is_contiguous(at::MemoryFormat::ChannelsLast) &&
      (!b_in.defined() || b_in.strides() == a_in.strides()))
    return channels_last_squares(a_in, b_in);
  const at::Tensor a = slices(a_in).contiguous(), b = b_in.defined() ? slices(b_in).contiguous() : at::Tensor();
  const std::int64_t n = a.size(0), s = a.size(1), rest = a.size(2);
  at::Tensor out = at::zeros({s}, at::TensorOptions().dtype(at::kDouble));
  const float* pa = a.data_ptr<float>();
  const float* pb = b.defined() ? b.data_ptr<float>() : nullptr;
  double* po = out.data_ptr<double>();
  at::parallel_for(0, s, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, n * rest)),
                   [&](std::int64_t s0, std::int64_t s1) {
                     for (std::int64_t j = s0; j < s1; ++j) {
                       double total = 0;
                       for (std::int64_t i = 0; i < n; ++i) {
                         const std::int64_t base = (i * s + j) * rest;
                         total += run_squares(pa + base, pb ? pb + base : nullptr, rest);
                       }
                       po[j] = total;
                     }
                   });
  return out;
}

inline Reference reference_of(std::vector<at::Tensor> outputs) {
  Reference r;
  for (const auto& o : outputs) {
    if (!o.defined() || o.is_nested() || !o.is_floating_point() || o.numel() == 0) {
      r.energy.emplace_back();
      continue;
    }
    r.energy.push_back(slice_squares(o, at::Tensor()));
  }
  r.outputs = std::move(outputs);
  return r;
}

/// Per slice: the squared error of `got` against the reference output `want`.
inline at::Tensor slice_error(const at::Tensor& got, const at::Tensor& want) { return slice_squares(got, want); }

/// One output's float energy and each candidate's squared error, per slice, summed over the
/// samples. Where the slice count changes between batches (another token count), totals over
/// all slices are kept from then on.
struct SliceSums {
  at::Tensor energy;
  std::vector<at::Tensor> error;  // per candidate

  void add(const at::Tensor& e, const std::vector<at::Tensor>& errs) {
    if (!energy.defined()) {
      energy = e.clone();
      for (const auto& x : errs) error.push_back(x.clone());
      return;
    }
    const bool same = energy.sizes() == e.sizes();
    if (!same) {
      energy = energy.sum().reshape({1});
      for (auto& x : error) x = x.sum().reshape({1});
    }
    energy += same ? e : e.sum().reshape({1});
    for (std::size_t c = 0; c < error.size(); ++c) error[c] += same ? errs[c] : errs[c].sum().reshape({1});
  }

  /// Candidate c's error relative to the energy of each slice, summed over the slices. Slices
  /// that are zero in float and stay so add nothing; a zero slice made non-zero counts fully.
  double relative(std::size_t c) const {
    if (!energy.defined()) return 0;
    const at::Tensor& num = error[c];
    return at::where(energy > 0, num / energy.clamp_min(1e-300), (num > 0).to(at::kDouble)).sum().item<double>();
  }
  /// relative(c) per slice: comparable between layers of different widths.
  double mean_relative(std::size_t c) const {
    return energy.defined() && energy.numel() > 0 ? relative(c) / static_cast<double>(energy.numel()) : 0;
  }
};

}  // namespace sparsebit::detail
