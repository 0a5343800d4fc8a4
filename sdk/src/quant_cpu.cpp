// The CPU's one-pass fake quantization (quant_cpu.h).

#include "quant_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

#include "sparsebit/sdk/kernels.h"

namespace sparsebit::detail {
namespace {
// fake_quantize on the CPU for float32 without gradients: the reference's float32 operations
// (divide, round half to even, add, clamp, subtract, multiply) in one pass. The six full-size
// temporaries of the ATen formulation made fake quantization the largest cost of the range
// selection (2.7 ms for 0.5 M values, 10x the layer's own run).
void fake_quantize_run_scalar(const float* x, std::int64_t len, float s, float zp, float lo, float hi, float* out) {
  for (std::int64_t i = 0; i < len; ++i) {
    float q = std::nearbyint(x[i] / s) + zp;
    q = std::max(std::min(q, hi), lo);  // std::min/max return their first operand for NaN
    out[i] = (q - zp) * s;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void fake_quantize_run_avx2(const float* x, std::int64_t len, float s, float zp,
                                                            float lo, float hi, float* out) {
  const __m256 vs = _mm256_set1_ps(s), vz = _mm256_set1_ps(zp), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  std::int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __m256 q =
        _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_max_ps(vlo, _mm256_min_ps(vhi, _mm256_add_ps(q, vz)));  // the second operand for NaN: NaN stays
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_sub_ps(q, vz), vs));
  }
  fake_quantize_run_scalar(x + i, len - i, s, zp, lo, hi, out + i);
}
#endif

void fake_quantize_run(const float* x, std::int64_t len, float s, float zp, float lo, float hi, float* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return fake_quantize_run_avx2(x, len, s, zp, lo, hi, out);
#endif
  fake_quantize_run_scalar(x, len, s, zp, lo, hi, out);
}

// The same with a parameter per value (s[i], zp[i]): a row of a group's values where the group
// runs along an outer axis ([K, N] weights grouped along K).
void fake_quantize_each_scalar(const float* x, std::int64_t len, const float* s, const float* zp, float lo, float hi,
                               float* out) {
  for (std::int64_t i = 0; i < len; ++i) {
    float q = std::nearbyint(x[i] / s[i]) + zp[i];
    q = std::max(std::min(q, hi), lo);
    out[i] = (q - zp[i]) * s[i];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void fake_quantize_each_avx2(const float* x, std::int64_t len, const float* s,
                                                             const float* zp, float lo, float hi, float* out) {
  const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  std::int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 vs = _mm256_loadu_ps(s + i), vz = _mm256_loadu_ps(zp + i);
    __m256 q =
        _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_max_ps(vlo, _mm256_min_ps(vhi, _mm256_add_ps(q, vz)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_sub_ps(q, vz), vs));
  }
  fake_quantize_each_scalar(x + i, len - i, s + i, zp + i, lo, hi, out + i);
}
#endif

void fake_quantize_each(const float* x, std::int64_t len, const float* s, const float* zp, float lo, float hi,
                        float* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return fake_quantize_each_avx2(x, len, s, zp, lo, hi, out);
#endif
  fake_quantize_each_scalar(x, len, s, zp, lo, hi, out);
}

}  // namespace

/// The fused CPU path where it applies (float32 x on the CPU, one parameter per tensor, per
/// channel with runs of at least 16 values, or per group along the last axis (groups of at least
/// 16) or along another one (rows of at least 16)), else an undefined tensor.
at::Tensor cpu_fake_quantize(const at::Tensor& x_in, const QParams& p, const QSpec& spec) {
  if (!x_in.device().is_cpu() || x_in.scalar_type() != at::kFloat || x_in.numel() == 0 || spec.is_float8()) return {};
  const ParamLayout l = param_layout(x_in, spec);
  if (p.scale.numel() != l.params() || p.zero_point.numel() != l.params()) return {};
  if (l.kind == ParamLayout::Kind::kChannel && (l.inner < 16 || p.scale.dim() == 0)) return {};
  if (l.kind == ParamLayout::Kind::kGroup && (l.inner == 1 ? l.group < 16 : l.inner < 16)) return {};
  const at::Tensor x = x_in.contiguous();
  const at::Tensor scale = p.scale.to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const at::Tensor zero_point = p.zero_point.to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  at::Tensor out = at::empty_like(x);
  const float *xs = x.data_ptr<float>(), *ss = scale.data_ptr<float>(), *zs = zero_point.data_ptr<float>();
  float* os = out.data_ptr<float>();
  const float lo = float(spec.qmin()), hi = float(spec.qmax());
  if (l.kind == ParamLayout::Kind::kTensor) {
    at::parallel_for(0, x.numel(), std::int64_t{1} << 15, [&](std::int64_t b, std::int64_t e) {
      fake_quantize_run(xs + b, e - b, ss[0], zs[0], lo, hi, os + b);
    });
  } else if (l.kind == ParamLayout::Kind::kGroup) {
    // x as [outer, n, inner]; the parameters [outer, ceil(n / group), inner] (group_param_shape).
    const std::int64_t blocks = (l.n + l.group - 1) / l.group;
    if (l.inner == 1) {  // runs of `group` values (the last shorter), run r with parameter r
      at::parallel_for(0, l.outer * blocks, std::max<std::int64_t>(1, (std::int64_t{1} << 15) / l.group),
                       [&](std::int64_t b, std::int64_t e) {
                         for (std::int64_t r = b; r < e; ++r) {
                           const std::int64_t first = (r / blocks) * l.n + (r % blocks) * l.group;
                           const std::int64_t len = std::min(l.group, l.n - (r % blocks) * l.group);
                           fake_quantize_run(xs + first, len, ss[r], zs[r], lo, hi, os + first);
                         }
                       });
    } else {  // rows of `inner` values, row (o, i) with the parameters' row (o, i / group)
      at::parallel_for(0, l.outer * l.n, std::max<std::int64_t>(1, (std::int64_t{1} << 15) / l.inner),
                       [&](std::int64_t b, std::int64_t e) {
                         for (std::int64_t r = b; r < e; ++r) {
                           const std::int64_t param = ((r / l.n) * blocks + (r % l.n) / l.group) * l.inner;
                           fake_quantize_each(xs + r * l.inner, l.inner, ss + param, zs + param, lo, hi,
                                              os + r * l.inner);
                         }
                       });
    }
  } else {  // runs of `inner` values, run r with parameter r % n
    at::parallel_for(0, l.outer * l.n, std::max<std::int64_t>(1, (std::int64_t{1} << 15) / l.inner),
                     [&](std::int64_t b, std::int64_t e) {
                       for (std::int64_t r = b; r < e; ++r)
                         fake_quantize_run(xs + r * l.inner, l.inner, ss[r % l.n], zs[r % l.n], lo, hi,
                                           os + r * l.inner);
                     });
  }
  return out;
}

}  // namespace sparsebit::detail
