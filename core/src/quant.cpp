#include "sparsebit/sdk/quant.h"

#include <ATen/ATen.h>

#include "sparsebit/sdk/error.h"

namespace sparsebit {

std::int64_t QSpec::qmin() const {
  if (!symmetric) return 0;
  return -(std::int64_t{1} << (bits - 1)) + (narrow_range ? 1 : 0);
}

std::int64_t QSpec::qmax() const {
  if (!symmetric) return (std::int64_t{1} << bits) - 1;
  return (std::int64_t{1} << (bits - 1)) - 1;
}

std::string QSpec::qscheme() const {
  return std::string(group_size > 0 ? "per-group-" : per_channel ? "per-channel-" : "per-tensor-") +
         (symmetric ? "symmetric" : "affine");
}

std::string QSpec::describe() const {
  std::string s = (symmetric ? "int" : "uint") + std::to_string(bits) + " ";
  s += group_size > 0 ? "per-group(" + std::to_string(group_size) + " along axis " + std::to_string(group_axis) + ")"
       : per_channel    ? "per-channel(axis " + std::to_string(channel_axis) + ")"
                        : std::string("per-tensor");
  s += symmetric ? " symmetric" : " affine";
  if (narrow_range) s += " narrow";
  return s;
}

QParams qparams_from_range(const at::Tensor& min_in, const at::Tensor& max_in, const QSpec& spec,
                           const std::string& where) {
  at::Tensor mn = min_in.detach().to(at::kFloat);
  at::Tensor mx = max_in.detach().to(at::kFloat);
  if (!at::isfinite(mn).all().item<bool>() || !at::isfinite(mx).all().item<bool>()) {
    throw Error(where + ": the observed range is not finite (min " +
                std::to_string(mn.min().item<float>()) + ", max " + std::to_string(mx.max().item<float>()) +
                "); the calibration data or the model produces NaN/Inf there. Check the inputs "
                "(and their scaling) and the float model's outputs on them");
  }
  mn = at::clamp_max(mn, 0.0);
  mx = at::clamp_min(mx, 0.0);
  const double range = double(spec.qmax() - spec.qmin());
  QParams p;
  if (spec.symmetric) {
    at::Tensor amax = at::maximum(mn.abs(), mx);
    p.scale = at::clamp_min(amax * (2.0 / range), kMinScale);
    p.zero_point = at::zeros_like(p.scale, p.scale.options().dtype(at::kInt));
  } else {
    p.scale = at::clamp_min((mx - mn) / range, kMinScale);
    at::Tensor zp = at::round(double(spec.qmin()) - mn / p.scale);
    p.zero_point = at::clamp(zp, double(spec.qmin()), double(spec.qmax())).to(at::kInt);
  }
  return p;
}

namespace {
std::int64_t group_axis_of(const at::Tensor& x, const QSpec& spec) {
  const std::int64_t a = spec.group_axis < 0 ? spec.group_axis + x.dim() : spec.group_axis;
  if (a < 0 || a >= x.dim()) throw Error("group axis " + std::to_string(spec.group_axis) + " does not exist in a tensor of shape " + c10::str(x.sizes()));
  return a;
}

// Reshapes per-channel parameters so they broadcast along spec.channel_axis of x.
at::Tensor broadcastable(const at::Tensor& param, const at::Tensor& x, const QSpec& spec) {
  if (spec.group_size > 0 && param.dim() > 0) {
    const std::int64_t a = group_axis_of(x, spec);
    return param.repeat_interleave(spec.group_size, a).narrow(a, 0, x.size(a));
  }
  if (!spec.per_channel || param.dim() == 0) return param;
  std::int64_t axis = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
  if (axis < 0 || axis >= x.dim() || x.size(axis) != param.numel()) {
    throw Error("per-channel parameters of size " + std::to_string(param.numel()) +
                " do not fit axis " + std::to_string(spec.channel_axis) + " of a tensor of shape " +
                c10::str(x.sizes()));
  }
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[static_cast<std::size_t>(axis)] = param.numel();
  return param.reshape(shape);
}
}  // namespace

at::Tensor expand_param(const at::Tensor& param, const at::Tensor& x, const QSpec& spec) {
  return broadcastable(param, x, spec);
}

std::vector<std::int64_t> group_param_shape(const at::Tensor& x, const QSpec& spec) {
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  const std::int64_t a = group_axis_of(x, spec);
  shape[static_cast<std::size_t>(a)] = (x.size(a) + spec.group_size - 1) / spec.group_size;
  return shape;
}

at::Tensor quant_rows(const at::Tensor& x, const QSpec& spec) {
  if (spec.group_size > 0) {
    const std::int64_t a = group_axis_of(x, spec), g = spec.group_size;
    at::Tensor moved = x.movedim(a, -1);
    const std::int64_t n = moved.size(-1), padded = (n + g - 1) / g * g;
    if (padded != n) moved = at::constant_pad_nd(moved, {0, padded - n}, 0.0);
    // [..., blocks, G] with the blocks in the order of group_param_shape(): rows follow the
    // moved layout, so callers map row values back with rows_to_params below.
    return moved.reshape({-1, g});
  }
  if (!spec.per_channel) return x.reshape({1, -1});
  const std::int64_t a = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
  return x.movedim(a, 0).reshape({x.size(a), -1});
}

at::Tensor rows_to_params(const at::Tensor& values, const std::vector<std::int64_t>& shape, const QSpec& spec) {
  if (spec.group_size > 0) {
    const auto rank = static_cast<std::int64_t>(shape.size());
    const std::int64_t a = spec.group_axis < 0 ? spec.group_axis + rank : spec.group_axis;
    std::vector<std::int64_t> moved;
    for (std::int64_t d = 0; d < rank; ++d)
      if (d != a) moved.push_back(shape[static_cast<std::size_t>(d)]);
    moved.push_back((shape[static_cast<std::size_t>(a)] + spec.group_size - 1) / spec.group_size);
    return values.reshape(moved).movedim(-1, a).contiguous();
  }
  if (!spec.per_channel) return values.reshape({});
  return values.reshape({-1});
}

at::Tensor quantize_to_int(const at::Tensor& x, const QParams& p, const QSpec& spec) {
  // Same float32 arithmetic as fake_quantize, so exported integers equal the simulation's.
  at::Tensor s = broadcastable(p.scale.to(x.device(), at::kFloat), x, spec);
  at::Tensor zp = broadcastable(p.zero_point.to(x.device(), at::kFloat), x, spec);
  at::Tensor q = at::round(x.detach().to(at::kFloat) / s) + zp;
  // Through int64: float32 cannot represent the int32 bounds of 32-bit (bias) ranges exactly.
  return at::clamp(q.to(at::kLong), spec.qmin(), spec.qmax()).to(at::kInt);
}

at::Tensor fake_quantize(const at::Tensor& x, const QParams& p, const QSpec& spec) {
  at::Tensor s = broadcastable(p.scale.to(x.device(), x.scalar_type()), x, spec);
  at::Tensor zp = broadcastable(p.zero_point.to(x.device(), x.scalar_type()), x, spec);
  at::Tensor q = at::round(x.detach() / s) + zp;
  at::Tensor fq = (at::clamp(q, double(spec.qmin()), double(spec.qmax())) - zp) * s;
  if (!x.requires_grad() && !s.requires_grad()) return fq;
  // Straight-through estimator: gradient 1 where x fell inside the integer range, else 0,
  // exactly as torch.fake_quantize_per_*_affine.
  at::Tensor inside = at::logical_and(q >= double(spec.qmin()), q <= double(spec.qmax())).to(x.scalar_type());
  return fq + (x - x.detach()) * inside;
}

}  // namespace sparsebit
