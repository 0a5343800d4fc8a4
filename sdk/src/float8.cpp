// Float8 elements (Note [Float8 elements] in quant.h): their largest values, names, rounding
// onto their grids and their byte codes.

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>

#include "sparsebit/sdk/error.h"
#include "float8_codes.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

double float8_max(QElement element) {
  switch (element) {
    case QElement::kFloat8E4M3FN: return 448.0;
    case QElement::kFloat8E5M2: return 57344.0;
    case QElement::kInt: break;
  }
  throw Error("float8_max: element " + std::to_string(static_cast<int>(element)) + " is not a float8 type");
}

std::string element_name(QElement element) {
  switch (element) {
    case QElement::kInt: return "int";
    case QElement::kFloat8E4M3FN: return "fp8_e4m3";
    case QElement::kFloat8E5M2: return "fp8_e5m2";
  }
  return "element " + std::to_string(static_cast<int>(element));
}

namespace {
struct Float8Format {
  int mantissa_bits, bias;
};
Float8Format float8_format(QElement e) {
  if (e == QElement::kFloat8E4M3FN) return {3, 7};
  if (e == QElement::kFloat8E5M2) return {2, 15};
  throw Error("float8: element " + std::to_string(static_cast<int>(e)) + " is not a float8 type");
}
}  // namespace

at::Tensor round_to_float8(const at::Tensor& v_in, QElement element) {
  const Float8Format f = float8_format(element);
  const double largest = float8_max(element);
  // Saturate first (clamp keeps NaN), then round on the grid of the value's binade: its spacing
  // is 2^(e - mantissa_bits) for |v| in [2^e, 2^(e+1)), and the subnormals' below the smallest
  // normal exponent 1 - bias. v / step and k * step are exact (powers of two), at::round rounds
  // half to even, so an even k is an even mantissa: round to nearest even on the format.
  const at::Tensor v = at::clamp(v_in.to(at::kFloat), -largest, largest);
  const at::Tensor exponent = std::get<1>(at::frexp(v)) - 1;  // floor(log2 |v|); 0 gives -1
  const at::Tensor step_exponent = at::clamp(exponent, 1 - f.bias, 16) - f.mantissa_bits;
  // 2^step_exponent built from its bit pattern, exact on every device.
  const at::Tensor step = ((step_exponent + 127) * (1 << 23)).to(at::kInt).view(at::kFloat);
  return at::round(v / step) * step;
}

namespace {
/// The value of each of the 256 codes (index = code), float32 on `device`, from the format's
/// definition: sign, exponent field e, mantissa m; subnormal when e = 0; NaN and infinity codes.
at::Tensor float8_values(QElement element, const at::Device& device) {
  const Float8Format f = float8_format(element);
  const at::Tensor codes = at::arange(256, at::TensorOptions().dtype(at::kInt).device(device));
  const at::Tensor sign = at::where(at::bitwise_and(codes, 0x80).ne(0), -1.0, 1.0);
  const at::Tensor field = at::bitwise_and(codes, 0x7F);
  const std::int64_t m_count = std::int64_t{1} << f.mantissa_bits;
  const at::Tensor e = at::floor_divide(field, m_count), m = at::remainder(field, m_count).to(at::kDouble);
  const at::Tensor normal = (1.0 + m / double(m_count)) * at::pow(2.0, (e - f.bias).to(at::kDouble));
  const at::Tensor subnormal = m / double(m_count) * std::pow(2.0, 1 - f.bias);
  at::Tensor value = at::where(e.eq(0), subnormal, normal) * sign;
  const std::int64_t all_ones = (std::int64_t{1} << (7 - f.mantissa_bits)) - 1;  // top exponent
  at::Tensor nan = element == QElement::kFloat8E4M3FN ? field.eq(0x7F) : at::logical_and(e.eq(all_ones), m.ne(0));
  value = at::where(nan, std::numeric_limits<double>::quiet_NaN(), value);
  if (element == QElement::kFloat8E5M2)
    value = at::where(at::logical_and(e.eq(all_ones), m.eq(0)), sign * std::numeric_limits<double>::infinity(), value);
  return value.to(at::kFloat);
}

}  // namespace

namespace detail {
/// The float8 codes of exactly representable values r (round_to_float8's output), from r's
/// float32 bits: a normal float8 keeps float32's sign, its exponent rebiased and the top mantissa
/// bits; a subnormal one (or zero) is |r| in units of the smallest subnormal. NaN is 0x7F.
at::Tensor encode_float8(const at::Tensor& r_in, QElement element) {
  const Float8Format f = float8_format(element);
  const at::Tensor r = r_in.to(at::kFloat).contiguous();
  const at::Tensor bits = r.view(at::kInt);
  const at::Tensor sign = at::bitwise_and(at::bitwise_right_shift(bits, 24), 0x80);
  const at::Tensor magnitude = at::bitwise_and(bits, 0x7FFFFFFF);
  const at::Tensor exponent = at::bitwise_right_shift(magnitude, 23) - (127 - f.bias);
  const at::Tensor normal = exponent * (1 << f.mantissa_bits) +
                            at::bitwise_right_shift(at::bitwise_and(magnitude, 0x7FFFFF), 23 - f.mantissa_bits);
  const at::Tensor subnormal =  // (clamped: the normal values' products may exceed int32)
      at::clamp_max(r.abs() * std::ldexp(1.0, f.bias - 1 + f.mantissa_bits), 255).to(at::kInt);
  at::Tensor code = at::bitwise_or(at::where(exponent.ge(1), normal, subnormal), sign);
  code = at::where(at::isnan(r), 0x7F, code);
  return code.to(at::kByte);
}
}  // namespace detail

at::Tensor decode_float8(const at::Tensor& codes, QElement element) {
  // A lookup: one gather, where decoding arithmetic costs tens of passes over the tensor.
  return float8_values(element, codes.device()).index({codes.to(at::kLong)});
}

}  // namespace sparsebit
