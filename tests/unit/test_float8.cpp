// Float8 arithmetic (Note [Float8 elements]) against a reference written from the formats'
// definitions: every code decoded by hand (sign, exponent, mantissa), and rounding checked as a
// brute-force search for the nearest code (ties to the even mantissa, saturating at the largest).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {
namespace {

struct Format {
  QElement element;
  int exponent_bits, mantissa_bits, bias;
  double largest;
};
const Format kE4M3{QElement::kFloat8E4M3FN, 4, 3, 7, 448};
const Format kE5M2{QElement::kFloat8E5M2, 5, 2, 15, 57344};

// The value of code c, from the definition (E4M3FN: S.1111.111 is NaN, no infinities; E5M2:
// IEEE-like, all-ones exponent is infinity or NaN).
double decode(const Format& f, int c) {
  const int sign = c >> 7, e = (c >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int m = c & ((1 << f.mantissa_bits) - 1);
  const int top = (1 << f.exponent_bits) - 1;
  if (f.element == QElement::kFloat8E4M3FN && e == top && m == (1 << f.mantissa_bits) - 1) return NAN;
  if (f.element == QElement::kFloat8E5M2 && e == top) return m ? NAN : (sign ? -INFINITY : INFINITY);
  const double frac = double(m) / (1 << f.mantissa_bits);
  const double mag = e == 0 ? std::ldexp(frac, 1 - f.bias) : std::ldexp(1 + frac, e - f.bias);
  return sign ? -mag : mag;
}

// Finite non-negative codes in increasing order of value.
std::vector<int> finite_codes(const Format& f) {
  std::vector<int> out;
  for (int c = 0; c < 128; ++c)
    if (std::isfinite(decode(f, c))) out.push_back(c);
  return out;
}

// Nearest finite value to v, ties to the code with the even mantissa bit, saturating (infinities
// too: ONNX's QuantizeLinear with saturate = 1 maps them to +-largest in both formats).
double nearest(const Format& f, double v) {
  if (std::isnan(v)) return NAN;
  const double a = std::min(std::fabs(v), f.largest);
  double best = 0;
  int best_code = 0;
  for (int c : finite_codes(f)) {
    const double d = std::fabs(decode(f, c) - a), bd = std::fabs(best - a);
    if (d < bd || (d == bd && (c & 1) == 0 && (best_code & 1) == 1)) {
      best = decode(f, c);
      best_code = c;
    }
  }
  return std::signbit(v) ? -best : best;
}

// A stable description in test listings (the default prints the struct's bytes, padding included).
void PrintTo(const Format& f, std::ostream* os) { *os << element_name(f.element); }

class Float8 : public ::testing::TestWithParam<Format> {};

TEST_P(Float8, DecodesEveryCodeAsTheFormatDefinesIt) {
  const Format f = GetParam();
  at::Tensor codes = at::arange(256, at::kInt).to(at::kByte);
  at::Tensor values = decode_float8(codes, f.element);
  for (int c = 0; c < 256; ++c) {
    const double want = decode(f, c), got = values[c].item<double>();
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << c;
    else EXPECT_EQ(got, want) << "code " << c;
  }
  EXPECT_EQ(float8_max(f.element), f.largest);
  EXPECT_EQ(decode(f, finite_codes(f).back()), f.largest);
}

TEST_P(Float8, RoundsToNearestEvenAndSaturatesLikeTheBruteForceSearch) {
  const Format f = GetParam();
  // Every finite value, every midpoint between neighbours (exact ties), points just either side
  // of each midpoint, beyond the largest value, float32 subnormals, zeros and random values.
  std::vector<float> v;
  const std::vector<int> codes = finite_codes(f);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const double a = decode(f, codes[i]);
    v.push_back(float(a));
    if (i + 1 < codes.size()) {
      const float mid = float((a + decode(f, codes[i + 1])) / 2);
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 0.0f));
      v.push_back(std::nextafter(mid, INFINITY));
    }
  }
  for (float x : {float(f.largest) * 1.03f, float(f.largest) * 1.0715f, float(f.largest) * 2, 1e30f, INFINITY,
                  std::numeric_limits<float>::denorm_min(), 1e-30f, 0.0f})
    v.push_back(x);
  at::manual_seed(3);
  at::Tensor random = at::randn({4096}) * at::exp(at::randn({4096}) * 4);
  for (std::int64_t i = 0; i < random.numel(); ++i) v.push_back(random[i].item<float>());
  const std::size_t positives = v.size();
  for (std::size_t i = 0; i < positives; ++i) v.push_back(-v[i]);
  v.push_back(NAN);

  at::Tensor x = at::tensor(v);
  at::Tensor r = round_to_float8(x, f.element);
  ASSERT_EQ(r.scalar_type(), at::kFloat);
  int wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double want = nearest(f, v[i]), got = r[static_cast<std::int64_t>(i)].item<double>();
    const bool same = std::isnan(want) ? std::isnan(got) : got == want && std::signbit(got) == std::signbit(want);
    if (!same && ++wrong < 10) ADD_FAILURE() << "round(" << v[i] << ") = " << got << ", nearest even is " << want;
  }
  EXPECT_EQ(wrong, 0);
  // Codes decode to the rounded values, bit for bit.
  QSpec spec;
  spec.element = f.element;
  const QParams unit{at::scalar_tensor(1.0f), at::scalar_tensor(0, at::kInt)};
  at::Tensor decoded = decode_float8(quantize_to_float8(x, unit, spec), f.element);
  EXPECT_TRUE(at::equal(at::nan_to_num(decoded, 7), at::nan_to_num(r, 7)));
  EXPECT_TRUE(at::equal(at::signbit(decoded), at::signbit(r)));
}

TEST_P(Float8, ScalesDivideTheLargestMagnitudeByTheLargestValue) {
  const Format f = GetParam();
  QSpec spec;
  spec.element = f.element;
  spec.per_channel = true;
  at::Tensor lo = at::tensor({-3.5f, -0.25f, 0.0f}), hi = at::tensor({1.0f, 7.75f, 0.0f});
  QParams p = qparams_from_range(lo, hi, spec, "test");
  at::Tensor want = at::tensor({3.5f, 7.75f, 0.0f}) / float(f.largest);
  EXPECT_TRUE(at::equal(p.scale.slice(0, 0, 2), want.slice(0, 0, 2)));
  EXPECT_EQ(p.scale[2].item<float>(), float(kMinScale));  // a constant tensor keeps a finite scale
  EXPECT_TRUE(at::equal(p.zero_point, at::zeros({3}, at::kInt)));
  EXPECT_EQ(spec.qmax(), std::int64_t(f.largest));
  EXPECT_EQ(spec.qmin(), -std::int64_t(f.largest));
}

TEST_P(Float8, FakeQuantizesPerChannelWithAStraightThroughGradient) {
  const Format f = GetParam();
  QSpec spec;
  spec.element = f.element;
  spec.per_channel = true;
  spec.channel_axis = 1;
  at::manual_seed(5);
  at::Tensor x = (at::randn({4, 3, 5}) * 2).requires_grad_();
  QParams p{at::tensor({0.5f, 0.01f, 0.002f}), at::zeros({3}, at::kInt)};
  at::Tensor y = fake_quantize(x, p, spec);
  at::Tensor s = p.scale.reshape({1, 3, 1});
  at::Tensor v = x.detach() / s;
  at::Tensor want = at::empty_like(v);
  for (std::int64_t i = 0; i < v.numel(); ++i) want.view(-1)[i] = nearest(f, v.view(-1)[i].item<float>());
  EXPECT_TRUE(at::equal(y.detach(), want * s));
  y.sum().backward();
  at::Tensor inside = (v.abs() <= f.largest).to(at::kFloat);
  EXPECT_TRUE(at::equal(x.grad(), inside));
  if (f.element == QElement::kFloat8E4M3FN) EXPECT_GT((1 - inside).sum().item<double>(), 0);  // some saturate
}

TEST_P(Float8, IntegerOnlyArithmeticRefusesFloat8Specs) {
  QSpec spec;
  spec.element = GetParam().element;
  at::Tensor x = at::randn({8});
  const QParams unit{at::scalar_tensor(1.0f), at::scalar_tensor(0, at::kInt)};
  EXPECT_THROW(quantize_to_int(x, unit, spec), Error);
  EXPECT_THROW(lsq_fake_quantize(x, unit.scale, unit.zero_point.to(at::kFloat), spec), Error);
  EXPECT_NE(spec.describe().find(element_name(spec.element)), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Formats, Float8, ::testing::Values(kE4M3, kE5M2),
                         [](const auto& info) { return info.param.bias == 7 ? "E4M3FN" : "E5M2"; });

}  // namespace
}  // namespace sparsebit
