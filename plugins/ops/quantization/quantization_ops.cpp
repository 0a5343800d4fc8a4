// QuantizeLinear and DequantizeLinear, so that QDQ models (our exports, or models quantized
// elsewhere) run through the executor. Arithmetic per Note [Quantization arithmetic].

#include <ATen/ATen.h>

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

class QQuantizeLinear final : public NodeQModule {
 public:
  // An int4/uint4 zero point (held widened, Graph::narrow_types) narrows the output range.
  explicit QQuantizeLinear(const OpContext& c)
      : NodeQModule(c), axis_(c.node.attr_int("axis", 1)), block_(c.node.attr_int("block_size", 0)) {
    if (c.node.has_input(2)) {
      auto it = c.graph.narrow_types.find(c.node.inputs[2]);
      if (it != c.graph.narrow_types.end()) narrow_ = it->second;
    }
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    at::Tensor zp_in = in.size() > 2 ? in[2] : at::Tensor();
    auto [s, zp] = params(node(), x, in.at(1), zp_in, axis_, block_);
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
  std::int32_t narrow_ = 0;
};

class QDequantizeLinear final : public NodeQModule {
 public:
  explicit QDequantizeLinear(const OpContext& c)
      : NodeQModule(c), axis_(c.node.attr_int("axis", 1)), block_(c.node.attr_int("block_size", 0)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& q = in.at(0);
    at::Tensor zp_in = in.size() > 2 ? in[2] : at::Tensor();
    auto [s, zp] = params(node(), q, in.at(1), zp_in, axis_, block_);
    return {(q.to(at::kFloat) - zp.to(at::kFloat)) * s.to(at::kFloat)};
  }

 private:
  std::int64_t axis_;
  std::int64_t block_;
};

void register_all(Registrar& r) {
  r.add_op<QQuantizeLinear>("QuantizeLinear");
  r.add_op<QDequantizeLinear>("DequantizeLinear");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.quantization", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
