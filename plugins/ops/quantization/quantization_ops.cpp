// QuantizeLinear and DequantizeLinear, so that QDQ models (our exports, or models quantized
// elsewhere) run through the executor. Arithmetic per Note [Quantization arithmetic].
//
// Also the integer-arithmetic ops of models quantized by other tools (ONNX Runtime's QOperator
// format, dynamic quantization): DynamicQuantizeLinear, MatMulInteger, ConvInteger,
// QLinearMatMul, QLinearConv, so such a model can be inspected, run and profiled. Products are
// accumulated in double, exact for any sum an int32 accumulator holds; requantization rounds half
// to even with the float32 multiplier s_a * s_b / s_y, as ONNX's reference computes it.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

// Scale and zero point shaped to broadcast against x along `axis` (per-axis), in blocks of
// `block` along it (block > 0), or as scalars.
std::pair<at::Tensor, at::Tensor> params(const Node& n, const at::Tensor& x, const at::Tensor& scale,
                                         const at::Tensor& zp_in, std::int64_t axis_attr, std::int64_t block) {
  at::Tensor zp = zp_in.defined() ? zp_in : at::zeros_like(scale, scale.options().dtype(at::kByte));
  if (block > 0) {  // opset 21 blocked quantization: one parameter per block along `axis`
    const std::int64_t axis = normalize_axis(axis_attr, x.dim(), n);
    if (scale.dim() != x.dim() || scale.size(axis) != (x.size(axis) + block - 1) / block)
      throw Error(n.describe() + ": scale of shape " + c10::str(scale.sizes()) + " does not fit blocks of " +
                  std::to_string(block) + " along axis " + std::to_string(axis) + " of " + c10::str(x.sizes()));
    return {scale.repeat_interleave(block, axis).narrow(axis, 0, x.size(axis)),
            zp.repeat_interleave(block, axis).narrow(axis, 0, x.size(axis))};
  }
  if (scale.numel() == 1 && scale.dim() <= 1) return {scale.reshape({}), zp.reshape({})};
  if (scale.dim() != 1) throw Error(n.describe() + ": a scale of rank > 1 needs the block_size attribute");
  const std::int64_t axis = normalize_axis(axis_attr, x.dim(), n);
  if (x.size(axis) != scale.numel())
    throw Error(n.describe() + ": scale has " + std::to_string(scale.numel()) + " values, axis " +
                std::to_string(axis) + " of the input has " + std::to_string(x.size(axis)));
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[static_cast<std::size_t>(axis)] = scale.numel();
  return {scale.reshape(shape), zp.reshape(shape)};
}

std::pair<double, double> int_range(at::ScalarType t, const Node& n) {
  switch (t) {
    case at::kByte: return {0, 255};
    case at::kChar: return {-128, 127};
    case at::kShort: return {-32768, 32767};
    case at::kInt: return {-2147483648.0, 2147483647.0};
    default: throw Error(n.describe() + ": unsupported quantized type " + std::string(c10::toString(t)));
  }
}

// Note [Float8 Q/DQ]: float8 values are held as their uint8 codes (Graph::narrow_types names
// the initializers, the import lets only Q/DQ read them). A float8 zero point makes
// QuantizeLinear round x / scale to the format (nearest, ties to even), saturating at the
// largest value unless saturate = 0: then what rounds beyond it is NaN for E4M3FN and infinity
// for E5M2, as ONNX's Cast defines. (ONNX's reference and ONNX Runtime 1.30 differ at that edge:
// E4M3FN values in [480, 496) become 448, and E5M2 overflows become NaN.) DequantizeLinear
// decodes. ONNX's reference ignores a float8 zero point's value, so one other than 0 is refused.
QElement float8_element(const Graph& g, const std::string& value) {
  auto it = g.narrow_types.find(value);
  if (it == g.narrow_types.end()) return QElement::kInt;
  return it->second == 17 ? QElement::kFloat8E4M3FN : it->second == 19 ? QElement::kFloat8E5M2 : QElement::kInt;
}

// Checked once, at construction: a float8 zero point is an initializer (or a folded Constant).
void check_float8_zero_point(const OpContext& c, QElement element) {
  if (element == QElement::kInt || !c.node.has_input(2)) return;
  auto zp = c.graph.initializers.find(c.node.inputs[2]);
  if (zp != c.graph.initializers.end() && decode_float8(zp->second, element).ne(0).any().item<bool>())
    throw Error(c.node.describe() +
                ": a float8 zero point other than 0 has no defined meaning (ONNX's reference "
                "ignores it); quantize with zero points of 0");
}

// Codes of v on `element`'s grid, as a cast with or without saturation.
at::Tensor float8_codes(const at::Tensor& v, QElement element, bool saturate) {
  QSpec spec;
  spec.element = element;
  QParams unit;
  unit.scale = at::ones({}, at::kFloat);
  unit.zero_point = at::zeros({}, at::kInt);
  at::Tensor codes = quantize_to_float8(v, unit, spec);
  if (saturate) return codes;
  // Beyond the largest value once rounded: E4M3FN's tie at 464 rounds to 448 (the even one of
  // 448 and 480), E5M2's at 61440 to 65536 (even, of 57344 and 65536).
  const bool e4m3 = element == QElement::kFloat8E4M3FN;
  const at::Tensor overflow = e4m3 ? v.abs().gt(464.0) : v.abs().ge(61440.0);
  const at::Tensor special = at::where(at::signbit(v), e4m3 ? 0xFF : 0xFC, e4m3 ? 0x7F : 0x7C).to(at::kByte);
  return at::where(overflow, special, codes);
}

class QQuantizeLinear final : public NodeQModule {
 public:
  // An int4/uint4 zero point (held widened, Graph::narrow_types) narrows the output range; a
  // float8 one makes the output float8 (Note [Float8 Q/DQ]).
  explicit QQuantizeLinear(const OpContext& c)
      : NodeQModule(c),
        axis_(c.node.attr_int("axis", 1)),
        block_(c.node.attr_int("block_size", 0)),
        saturate_(c.node.attr_int("saturate", 1) != 0) {
    if (c.node.has_input(2)) {
      auto it = c.graph.narrow_types.find(c.node.inputs[2]);
      if (it != c.graph.narrow_types.end()) narrow_ = it->second;
      float8_ = float8_element(c.graph, c.node.inputs[2]);
    } else {
      output_type(c.node.attr_int("output_dtype", 0));
    }
    check_float8_zero_point(c, float8_);
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor zp_in = in.size() > 2 ? in[2] : at::Tensor();
    if (!zp_in.defined()) zp_in = at::zeros_like(in.at(1), in.at(1).options().dtype(zero_point_type_));
    auto [s, zp] = params(node(), x, in.at(1), zp_in, axis_, block_);
    if (float8_ != QElement::kInt) return {float8_codes(x.to(at::kFloat) / s.to(at::kFloat), float8_, saturate_)};
    const at::ScalarType qt = zp.scalar_type();
    auto [lo, hi] = int_range(qt, node());
    if (narrow_ == 22) std::tie(lo, hi) = std::make_pair(-8.0, 7.0);    // int4
    if (narrow_ == 21) std::tie(lo, hi) = std::make_pair(0.0, 15.0);    // uint4
    if (narrow_ == 4) std::tie(lo, hi) = std::make_pair(0.0, 65535.0);  // uint16 (held as int32)
    at::Tensor q = at::round(x.to(at::kFloat) / s.to(at::kFloat)) + zp.to(at::kFloat);
    return {at::clamp(q.to(at::kLong), static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi)).to(qt)};
  }

 private:
  std::int64_t axis_;
  std::int64_t block_;
  // Opset 21: without a zero point, output_dtype (an ONNX element type) gives the output's type
  // (0: uint8), with a zero point of 0.
  void output_type(std::int64_t t) {
    switch (t) {
      case 0:
      case 2: zero_point_type_ = at::kByte; break;
      case 3: zero_point_type_ = at::kChar; break;
      case 4: std::tie(zero_point_type_, narrow_) = std::make_pair(at::kInt, 4); break;  // uint16
      case 5: zero_point_type_ = at::kShort; break;
      case 21: std::tie(zero_point_type_, narrow_) = std::make_pair(at::kByte, 21); break;  // uint4
      case 22: std::tie(zero_point_type_, narrow_) = std::make_pair(at::kChar, 22); break;  // int4
      case 17: float8_ = QElement::kFloat8E4M3FN; break;
      case 19: float8_ = QElement::kFloat8E5M2; break;
      default:
        throw Error(describe() + ": output_dtype " + std::to_string(t) +
                    " is not a type the executor quantizes to (uint8, int8, uint16, int16, uint4, int4, "
                    "float8e4m3fn, float8e5m2)");
    }
  }

  bool saturate_;
  std::int32_t narrow_ = 0;
  QElement float8_ = QElement::kInt;
  at::ScalarType zero_point_type_ = at::kByte;  // of the zero point 0 when none is given
};

class QDequantizeLinear final : public NodeQModule {
 public:
  // Float8 input: a float8 initializer or zero point, or a QuantizeLinear's float8 output (by
  // its zero point or output_dtype).
  explicit QDequantizeLinear(const OpContext& c)
      : NodeQModule(c), axis_(c.node.attr_int("axis", 1)), block_(c.node.attr_int("block_size", 0)) {
    float8_ = float8_element(c.graph, c.node.inputs.at(0));
    if (float8_ == QElement::kInt && c.node.has_input(2)) float8_ = float8_element(c.graph, c.node.inputs[2]);
    const Node* producer = c.graph.producer(c.node.inputs.at(0));
    if (float8_ == QElement::kInt && producer && producer->op_type == "QuantizeLinear" && producer->domain.empty()) {
      const std::int64_t out = producer->attr_int("output_dtype", 0);
      float8_ = producer->has_input(2) ? float8_element(c.graph, producer->inputs[2])
                : out == 17            ? QElement::kFloat8E4M3FN
                : out == 19            ? QElement::kFloat8E5M2
                                       : QElement::kInt;
    }
    check_float8_zero_point(c, float8_);
    if (float8_ != QElement::kInt) values_ = decode_float8(at::arange(256, at::kInt).to(at::kByte), float8_);
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& q = in.at(0);
    at::Tensor zp_in = in.size() > 2 ? in[2] : at::Tensor();
    auto [s, zp] = params(node(), q, in.at(1), zp_in, axis_, block_);
    at::Tensor y;
    if (float8_ != QElement::kInt) {  // the codes' values from the table built once (no per-call setup)
      if (values_.device() != q.device()) values_ = values_.to(q.device());
      y = values_.index({q.to(at::kLong)}) * s.to(at::kFloat);
    } else {
      y = (q.to(at::kFloat) - zp.to(at::kFloat)) * s.to(at::kFloat);
    }
    // The output has the scale's type (float16 and bfloat16 too), computed in float32.
    return {y.to(in.at(1).scalar_type())};
  }

 private:
  std::int64_t axis_;
  std::int64_t block_;
  QElement float8_ = QElement::kInt;
  at::Tensor values_;  // of the 256 codes (float8 input), moved to the input's device on first use
};

// A zero point or scale of an integer-arithmetic op as a tensor broadcasting against its
// operand: a scalar, or one value per row (axis -2, rows = true) or column / output channel.
at::Tensor per_axis(const at::Tensor& v, const at::Tensor& operand, std::int64_t axis, const Node& n,
                    const char* what) {
  if (!v.defined()) return at::zeros({}, at::kDouble);
  at::Tensor d = v.to(at::kDouble);
  if (d.numel() == 1) return d.reshape({});
  const std::int64_t a = axis < 0 ? axis + operand.dim() : axis;
  if (d.dim() != 1 || a < 0 || a >= operand.dim() || d.numel() != operand.size(a))
    throw Error(n.describe() + ": " + what + " has shape " + c10::str(d.sizes()) + ", expected a scalar or " +
                std::to_string(a >= 0 && a < operand.dim() ? operand.size(a) : 0) + " values along axis " +
                std::to_string(a) + " of " + c10::str(operand.sizes()));
  std::vector<std::int64_t> shape(static_cast<std::size_t>(operand.dim()), 1);
  shape[static_cast<std::size_t>(a)] = d.numel();
  return d.reshape(shape);
}

at::Tensor input_or_undefined(const std::vector<at::Tensor>& in, std::size_t i) {
  return i < in.size() && in[i].defined() ? in[i] : at::Tensor();
}

// round half to even of acc * (s_a * s_b / s_y) in float32, plus the output zero point, saturated.
at::Tensor requantize(const at::Tensor& acc, const at::Tensor& multiplier, const at::Tensor& y_zp, const Node& n) {
  auto [lo, hi] = int_range(y_zp.scalar_type(), n);
  at::Tensor y = at::round(acc * multiplier.to(at::kDouble)) + y_zp.to(at::kDouble);
  return at::clamp(y, lo, hi).to(y_zp.scalar_type());
}

// Note [MatMulNBits]: ONNX Runtime's contrib op com.microsoft.MatMulNBits, Y = A @ W^T (+ bias)
// with W [N, K] block-quantized along K: B uint8 [N, k_blocks, block_size * bits / 8] holds the
// codes packed low bits first, scales [N * k_blocks] (or [N, k_blocks]), zero points either
// packed like B ([N * ceil(k_blocks * bits / 8)] uint8) or unpacked in A's type, 2^(bits - 1)
// when absent; g_idx [K] (int32) gives each column's block where it is not k / block_size.
// W[n, k] = (code - zp[n, b]) * scale[n, b]. Run in float here, so exports in this format are
// checked by the executor too.
at::Tensor unpack_codes(const at::Tensor& packed, std::int64_t bits, std::int64_t count) {
  const at::Tensor p = packed.to(at::kLong).reshape({packed.size(0), -1});  // [rows, bytes]
  const std::int64_t per_byte = 8 / bits, mask = (std::int64_t{1} << bits) - 1;
  std::vector<at::Tensor> parts;
  for (std::int64_t j = 0; j < per_byte; ++j)
    parts.push_back(at::bitwise_and(at::bitwise_right_shift(p, j * bits), mask));
  return at::stack(parts, 2).reshape({packed.size(0), -1}).narrow(1, 0, count);  // low bits first
}

class QMatMulNBits final : public NodeQModule {
 public:
  explicit QMatMulNBits(const OpContext& c)
      : NodeQModule(c),
        k_(c.node.attr_int("K", 0)),
        n_(c.node.attr_int("N", 0)),
        bits_(c.node.attr_int("bits", 4)),
        block_(c.node.attr_int("block_size", 0)) {
    if (bits_ != 2 && bits_ != 4 && bits_ != 8)
      throw Error(c.node.describe() + ": bits = " + std::to_string(bits_) + " (2, 4 or 8 are defined)");
    if (k_ < 1 || n_ < 1 || block_ < 16 || (block_ & (block_ - 1)) != 0)
      throw Error(c.node.describe() + ": needs K >= 1, N >= 1 and a power-of-two block_size >= 16 (K " +
                  std::to_string(k_) + ", N " + std::to_string(n_) + ", block_size " + std::to_string(block_) + ")");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& a = in.at(0);
    const std::int64_t blocks = (k_ + block_ - 1) / block_;
    const at::Tensor& b = in.at(1);
    if (b.numel() != n_ * blocks * block_ * bits_ / 8)
      throw Error(describe() + ": B has " + std::to_string(b.numel()) + " bytes, expected N x k_blocks x blob = " +
                  std::to_string(n_) + " x " + std::to_string(blocks) + " x " + std::to_string(block_ * bits_ / 8));
    if (a.size(-1) != k_)
      throw Error(describe() + ": A " + c10::str(a.sizes()) + " does not end in K = " + std::to_string(k_));
    if (at::Tensor y = run_on_device_kernels(in); y.defined()) return {y};
    const at::Tensor codes = unpack_codes(b.reshape({n_, -1}), bits_, k_).to(at::kFloat);  // [N, K]
    const at::Tensor scale = in.at(2).to(a.device(), at::kFloat).reshape({n_, blocks});
    if (scale.numel() != n_ * blocks)
      throw Error(describe() + ": scales must have N x k_blocks = " + std::to_string(n_ * blocks) + " values");
    at::Tensor zp;
    const at::Tensor z = input_or_undefined(in, 3);
    if (!z.defined()) zp = at::full({n_, blocks}, double(std::int64_t{1} << (bits_ - 1)), scale.options());
    else if (z.scalar_type() == at::kByte) zp = unpack_codes(z.reshape({n_, -1}), bits_, blocks).to(at::kFloat);
    else zp = z.to(at::kFloat).reshape({n_, blocks});
    at::Tensor block_of = at::arange(k_, scale.options().dtype(at::kLong)).div(block_, "floor");
    if (const at::Tensor g = input_or_undefined(in, 4); g.defined()) {
      if (g.numel() != k_) throw Error(describe() + ": g_idx must have K = " + std::to_string(k_) + " values");
      block_of = g.to(scale.device(), at::kLong).reshape({k_});
    }
    const at::Tensor w = (codes - zp.index_select(1, block_of)) * scale.index_select(1, block_of);
    at::Tensor y = at::matmul(a.to(at::kFloat), w.t());
    if (const at::Tensor bias = input_or_undefined(in, 5); bias.defined()) y = y + bias.to(at::kFloat);
    return {y.to(a.scalar_type())};
  }

 private:
  // Note [MatMulNBits kernels]: a device plugin's kernel where it takes the arguments (no g_idx,
  // zero points packed or absent, float32/float16 A and scales of A's type); else undefined.
  at::Tensor run_on_device_kernels(const std::vector<at::Tensor>& in) const {
    const at::Tensor& a = in.at(0);
    MatMulNBitsKernels* kernels = a.device().is_cpu() ? nullptr : matmul_nbits_kernels(a.device().type());
    if (!kernels || input_or_undefined(in, 4).defined()) return {};
    MatMulNBitsArgs args;
    args.a = a.reshape({-1, k_});
    args.b = in.at(1);
    args.scales = in.at(2);
    args.zero_points = input_or_undefined(in, 3);
    args.k = k_;
    args.n = n_;
    args.bits = bits_;
    args.block_size = block_;
    at::Tensor y = kernels->matmul_nbits(args);
    if (!y.defined()) return {};
    std::vector<std::int64_t> shape = a.sizes().vec();
    shape.back() = n_;
    y = y.reshape(shape);
    if (const at::Tensor bias = input_or_undefined(in, 5); bias.defined()) y = y + bias.to(y.scalar_type());
    return y;
  }

  std::int64_t k_, n_, bits_, block_;
};

// DynamicQuantizeLinear: uint8 over [min(0, min x), max(0, max x)], with its scale and zero point.
class QDynamicQuantizeLinear final : public NodeQModule {
 public:
  explicit QDynamicQuantizeLinear(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor x = in.at(0).to(at::kFloat);
    const float lo = std::min(0.f, x.numel() ? x.min().item<float>() : 0.f);
    const float hi = std::max(0.f, x.numel() ? x.max().item<float>() : 0.f);
    const float scale = (hi - lo) / 255.f;
    const float zp = scale > 0 ? std::nearbyint(std::clamp(-lo / scale, 0.f, 255.f)) : 0.f;
    at::Tensor q = scale > 0 ? at::clamp(at::round(x / scale) + zp, 0, 255) : at::full_like(x, zp);
    return {q.to(at::kByte), at::full({}, scale, x.options()), at::full({}, zp, x.options()).to(at::kByte)};
  }
};

// MatMulInteger: (A - a_zero_point) x (B - b_zero_point) in int32; zero points per row of A /
// per column of B or scalars.
class QMatMulInteger final : public NodeQModule {
 public:
  explicit QMatMulInteger(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& a = in.at(0);
    const at::Tensor& b = in.at(1);
    at::Tensor ad = a.to(at::kDouble) - per_axis(input_or_undefined(in, 2), a, -2, node(), "a_zero_point");
    at::Tensor bd = b.to(at::kDouble) - per_axis(input_or_undefined(in, 3), b, -1, node(), "b_zero_point");
    return {at::matmul(ad, bd).to(at::kInt)};
  }
};

// ConvInteger: Conv over (x - x_zero_point) and (w - w_zero_point, per output channel or
// scalar), padding with the zero point (0 after the shift), in int32.
class QConvInteger final : public NodeQModule {
 public:
  explicit QConvInteger(const OpContext& c) : NodeQModule(c), win_(c.node), group_(c.node.attr_int("group", 1)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& w = in.at(1);
    at::Tensor xd = x.to(at::kDouble) - per_axis(input_or_undefined(in, 2), x, 1, node(), "x_zero_point");
    at::Tensor wd = w.to(at::kDouble) - per_axis(input_or_undefined(in, 3), w, 0, node(), "w_zero_point");
    return {at::round(onnx_conv(xd, wd, at::Tensor(), win_, group_, node())).to(at::kInt)};
  }

 private:
  Window win_;
  std::int64_t group_;
};

// QLinearMatMul: MatMulInteger, then requantized to y's scale and zero point.
class QLinearMatMul final : public NodeQModule {
 public:
  explicit QLinearMatMul(const OpContext& c) : NodeQModule(c) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& a = in.at(0);
    const at::Tensor& b = in.at(3);
    at::Tensor ad = a.to(at::kDouble) - per_axis(in.at(2), a, -2, node(), "a_zero_point");
    at::Tensor bd = b.to(at::kDouble) - per_axis(in.at(5), b, -1, node(), "b_zero_point");
    at::Tensor acc = at::matmul(ad, bd);
    at::Tensor m = (per_axis(in.at(1), a, -2, node(), "a_scale").to(at::kFloat) *
                    per_axis(in.at(4), b, -1, node(), "b_scale").to(at::kFloat)) /
                   in.at(6).to(at::kFloat).reshape({});
    return {requantize(acc, m, in.at(7).reshape({}), node())};
  }
};

// QLinearConv: ConvInteger plus the int32 bias, requantized (w_scale per output channel or
// scalar).
class QLinearConv final : public NodeQModule {
 public:
  explicit QLinearConv(const OpContext& c) : NodeQModule(c), win_(c.node), group_(c.node.attr_int("group", 1)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& w = in.at(3);
    at::Tensor xd = x.to(at::kDouble) - per_axis(in.at(2), x, 1, node(), "x_zero_point");
    at::Tensor wd = w.to(at::kDouble) - per_axis(in.at(5), w, 0, node(), "w_zero_point");
    at::Tensor bias = in.size() > 8 && in[8].defined() ? in[8].to(at::kDouble) : at::Tensor();
    at::Tensor acc = onnx_conv(xd, wd, bias, win_, group_, node());
    std::vector<std::int64_t> channel(static_cast<std::size_t>(acc.dim()), 1);
    channel[1] = -1;
    at::Tensor ws = in.at(4).to(at::kFloat).reshape({-1});
    if (ws.numel() != 1 && ws.numel() != acc.size(1))
      throw Error(describe() + ": w_scale has " + std::to_string(ws.numel()) + " values for " +
                  std::to_string(acc.size(1)) + " output channels");
    at::Tensor m = in.at(1).to(at::kFloat).reshape({}) *
                   ws.reshape(ws.numel() == 1 ? std::vector<std::int64_t>{} : channel) /
                   in.at(6).to(at::kFloat).reshape({});
    return {requantize(acc, m, in.at(7).reshape({}), node())};
  }

 private:
  Window win_;
  std::int64_t group_;
};

void register_all(Registrar& r) {
  r.add_op<QQuantizeLinear>("QuantizeLinear");
  r.add_op<QDequantizeLinear>("DequantizeLinear");
  r.add_op<QDynamicQuantizeLinear>("DynamicQuantizeLinear");
  r.add_op<QMatMulInteger>("MatMulInteger");
  r.add_op<QConvInteger>("ConvInteger");
  r.add_op<QLinearMatMul>("QLinearMatMul");
  r.add_op<QLinearConv>("QLinearConv");
  r.add_op<QMatMulNBits>("MatMulNBits", "com.microsoft");
  for (const char* op : {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
                         "QLinearMatMul", "QLinearConv"})
    r.add_op_traits<SameMeaning<>>(op);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.quantization", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
