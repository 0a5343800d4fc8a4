#include "sparsebit/sdk/quant.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "float8_codes.h"
#include "quant_cpu.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/kernels.h"

namespace sparsebit {

std::int64_t QSpec::qmin() const {
  if (is_float8()) return -static_cast<std::int64_t>(float8_max(element));
  if (!symmetric) return 0;
  return -(std::int64_t{1} << (bits - 1)) + (narrow_range ? 1 : 0);
}

std::int64_t QSpec::qmax() const {
  if (is_float8()) return static_cast<std::int64_t>(float8_max(element));
  if (!symmetric) return (std::int64_t{1} << bits) - 1;
  return (std::int64_t{1} << (bits - 1)) - 1;
}

std::string QSpec::qscheme() const {
  return std::string(group_size > 0 ? "per-group-"
                     : per_channel  ? "per-channel-"
                                    : "per-tensor-") +
         (symmetric ? "symmetric" : "affine");
}

std::string QSpec::describe() const {
  std::string s = is_float8() ? element_name(element) + " " : (symmetric ? "int" : "uint") + std::to_string(bits) + " ";
  s += group_size > 0 ? "per-group(" + std::to_string(group_size) + " along axis " + std::to_string(group_axis) + ")"
       : per_channel  ? "per-channel(axis " + std::to_string(channel_axis) + ")"
                      : std::string("per-tensor");
  s += symmetric ? " symmetric" : " affine";
  if (narrow_range) s += " narrow";
  if (reduce_range) s += " reduce-range";
  return s;
}

QParams qparams_from_range(const at::Tensor& min_in, const at::Tensor& max_in, const QSpec& spec,
                           const std::string& where) {
  at::Tensor mn = min_in.detach().to(at::kFloat);
  at::Tensor mx = max_in.detach().to(at::kFloat);
  if (!at::isfinite(mn).all().item<bool>() || !at::isfinite(mx).all().item<bool>()) {
    throw Error(where + ": the observed range is not finite (min " + std::to_string(mn.min().item<float>()) + ", max " +
                std::to_string(mx.max().item<float>()) +
                "); the calibration data or the model produces NaN/Inf there. Check the inputs "
                "(and their scaling) and the float model's outputs on them");
  }
  mn = at::clamp_max(mn, 0.0);
  mx = at::clamp_min(mx, 0.0);
  const double range = double(spec.qmax() - spec.qmin());
  QParams p;
  if (spec.is_float8()) {  // Note [Float8 elements]: amax onto the largest value, by division
    p.scale = at::clamp_min(at::maximum(mn.abs(), mx) / float8_max(spec.element), kMinScale);
    p.zero_point = at::zeros_like(p.scale, p.scale.options().dtype(at::kInt));
  } else if (spec.symmetric) {
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
  if (a < 0 || a >= x.dim())
    throw Error("group axis " + std::to_string(spec.group_axis) + " does not exist in a tensor of shape " +
                c10::str(x.sizes()));
  return a;
}

// Note [Dense layouts]: a channels-last activation (Note [Channels-last convolutions]), or any
// other dense tensor whose dims are permuted in memory, is a contiguous tensor seen through a
// permutation of its dims. Per-tensor quantization does not depend on the order of elements, so
// it runs on the permuted, contiguous tensor and permutes the result back: no copy (a
// reshape of a channels-last tensor copied all of it: 82 ms for 154 MB on 2 cores).
std::vector<std::int64_t> contiguous_permutation(const at::Tensor& x) {
  if (x.is_contiguous() || !x.is_non_overlapping_and_dense()) return {};
  std::vector<std::int64_t> perm(static_cast<std::size_t>(x.dim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](std::int64_t a, std::int64_t b) { return x.stride(a) > x.stride(b); });
  if (!x.permute(perm).is_contiguous()) return {};
  return perm;
}

std::vector<std::int64_t> inverse(const std::vector<std::int64_t>& perm) {
  std::vector<std::int64_t> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
  return inv;
}

bool per_tensor(const QSpec& spec) { return !spec.per_channel && spec.group_size == 0; }

// Reshapes per-channel parameters so they broadcast along spec.channel_axis of x.
at::Tensor broadcastable(const at::Tensor& param, const at::Tensor& x, const QSpec& spec) {
  if (spec.group_size > 0 && param.dim() > 0) {
    const std::int64_t a = group_axis_of(x, spec);
    return param.repeat_interleave(spec.group_size, a).narrow(a, 0, x.size(a));
  }
  if (!spec.per_channel || param.dim() == 0) return param;
  std::int64_t axis = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
  if (axis < 0 || axis >= x.dim() || x.size(axis) != param.numel()) {
    throw Error("per-channel parameters of size " + std::to_string(param.numel()) + " do not fit axis " +
                std::to_string(spec.channel_axis) + " of a tensor of shape " + c10::str(x.sizes()));
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
  if (!spec.per_channel) {
    const auto perm = contiguous_permutation(x);  // Note [Dense layouts]
    return (perm.empty() ? x : x.permute(perm)).reshape({1, -1});
  }
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

ParamLayout param_layout(const at::Tensor& x, const QSpec& spec) {
  ParamLayout l;
  auto around = [&](std::int64_t a) {
    for (std::int64_t d = 0; d < a; ++d) l.outer *= x.size(d);
    l.n = x.size(a);
    for (std::int64_t d = a + 1; d < x.dim(); ++d) l.inner *= x.size(d);
  };
  if (spec.group_size > 0) {
    around(group_axis_of(x, spec));
    l.kind = ParamLayout::Kind::kGroup;
    l.group = spec.group_size;
  } else if (spec.per_channel) {
    const std::int64_t a = spec.channel_axis < 0 ? spec.channel_axis + x.dim() : spec.channel_axis;
    if (a < 0 || a >= x.dim())
      throw Error("channel axis " + std::to_string(spec.channel_axis) + " does not exist in a tensor of shape " +
                  c10::str(x.sizes()));
    around(a);
    l.kind = ParamLayout::Kind::kChannel;
  } else {
    l.n = x.numel();
  }
  return l;
}

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The kernels for x's device when x and its parameters suit them (float32 x, one parameter per
// layout entry), else nullptr: the reference path then runs (and reports shape errors).
QuantKernels* kernels_for(const at::Tensor& x, const at::Tensor& scale, const QSpec& spec) {
  if (spec.is_float8()) return nullptr;  // the kernels compute on integer grids
  if (!x.defined() || x.scalar_type() != at::kFloat || x.numel() == 0) return nullptr;
  QuantKernels* k = quant_kernels(x.device().type());
  if (!k || !scale.defined()) return nullptr;
  const ParamLayout l = param_layout(x, spec);
  if (scale.numel() != l.params()) return nullptr;
  if (spec.per_channel && spec.group_size == 0 && scale.dim() == 0) return nullptr;
  return k;
}

QuantArgs make_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point, const QSpec& spec) {
  QuantArgs a;
  a.x = x.detach().contiguous();
  a.scale = scale.detach().to(x.device(), at::kFloat).contiguous().reshape({-1});
  a.zero_point = zero_point.detach().to(x.device(), at::kFloat).contiguous().reshape({-1});
  a.layout = param_layout(x, spec);
  a.qmin = spec.qmin();
  a.qmax = spec.qmax();
  return a;
}

// QuantArgs travel to backward as saved tensors plus these integers.
void save_args(AutogradContext* ctx, const QuantArgs& a, std::vector<at::Tensor> extra = {}) {
  extra.insert(extra.begin(), {a.x, a.scale, a.zero_point});
  ctx->save_for_backward(extra);
  ctx->saved_data["kind"] = static_cast<std::int64_t>(a.layout.kind);
  ctx->saved_data["outer"] = a.layout.outer;
  ctx->saved_data["n"] = a.layout.n;
  ctx->saved_data["inner"] = a.layout.inner;
  ctx->saved_data["group"] = a.layout.group;
  ctx->saved_data["qmin"] = a.qmin;
  ctx->saved_data["qmax"] = a.qmax;
}
QuantArgs load_args(AutogradContext* ctx, std::vector<at::Tensor>* extra) {
  variable_list saved = ctx->get_saved_variables();
  QuantArgs a;
  a.x = saved[0];
  a.scale = saved[1];
  a.zero_point = saved[2];
  a.layout.kind = static_cast<ParamLayout::Kind>(ctx->saved_data["kind"].toInt());
  a.layout.outer = ctx->saved_data["outer"].toInt();
  a.layout.n = ctx->saved_data["n"].toInt();
  a.layout.inner = ctx->saved_data["inner"].toInt();
  a.layout.group = ctx->saved_data["group"].toInt();
  a.qmin = ctx->saved_data["qmin"].toInt();
  a.qmax = ctx->saved_data["qmax"].toInt();
  if (extra) extra->assign(saved.begin() + 3, saved.end());
  return a;
}
QuantKernels* kernels_of(const QuantArgs& a) { return quant_kernels(a.x.device().type()); }

// Straight-through fake quantization with a fused backward; gradient for x only.
struct FakeQuantizeFn : torch::autograd::Function<FakeQuantizeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, QuantArgs args) {
    save_args(ctx, args);
    return kernels_of(args)->fake_quantize(args);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    QuantArgs a = load_args(ctx, nullptr);
    return {kernels_of(a)->fake_quantize_backward(grads[0].contiguous(), a), at::Tensor()};
  }
};

struct LsqFn : torch::autograd::Function<LsqFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, QuantArgs args) {
    save_args(ctx, args);
    ctx->saved_data["scale_shape"] = scale.sizes().vec();
    ctx->saved_data["zp_shape"] = zero_point.sizes().vec();
    ctx->saved_data["zp_grad"] = zero_point.requires_grad();
    return kernels_of(args)->lsq_forward(args);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    QuantArgs a = load_args(ctx, nullptr);
    auto [gx, gs, gz] = kernels_of(a)->lsq_backward(grads[0].contiguous(), a);
    gs = gs.reshape(ctx->saved_data["scale_shape"].toIntVector());
    gz = ctx->saved_data["zp_grad"].toBool() ? gz.reshape(ctx->saved_data["zp_shape"].toIntVector()) : at::Tensor();
    return {gx, gs, gz, at::Tensor()};
  }
};

struct SoftRoundFn : torch::autograd::Function<SoftRoundFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& v, QuantArgs args, double zeta, double gamma) {
    at::Tensor vc = v.detach().contiguous();
    save_args(ctx, args, {vc});
    ctx->saved_data["zeta"] = zeta;
    ctx->saved_data["gamma"] = gamma;
    return kernels_of(args)->soft_round_forward(args, vc, zeta, gamma);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    std::vector<at::Tensor> extra;
    QuantArgs a = load_args(ctx, &extra);
    const double zeta = ctx->saved_data["zeta"].toDouble(), gamma = ctx->saved_data["gamma"].toDouble();
    return {kernels_of(a)->soft_round_backward(grads[0].contiguous(), a, extra[0], zeta, gamma), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};
}  // namespace

namespace {
/// x / scale on x's device, scale broadcast per spec (float32).
at::Tensor divided_by_scale(const at::Tensor& x, const QParams& p, const QSpec& spec) {
  return x.to(at::kFloat) / broadcastable(p.scale.to(x.device(), at::kFloat), x, spec);
}
}  // namespace

at::Tensor quantize_to_float8(const at::Tensor& x, const QParams& p, const QSpec& spec) {
  if (!spec.is_float8()) throw Error("quantize_to_float8: the spec is " + spec.describe() + ", not a float8 one");
  return detail::encode_float8(round_to_float8(divided_by_scale(x.detach(), p, spec), spec.element), spec.element);
}

at::Tensor quantize_to_int(const at::Tensor& x, const QParams& p, const QSpec& spec) {
  if (spec.is_float8())
    throw Error("quantize_to_int: the spec is " + spec.describe() + "; its values are float8 (quantize_to_float8)");
  if (QuantKernels* k = kernels_for(x, p.scale, spec))
    return k->quantize_to_int(make_args(x, p.scale, p.zero_point, spec));
  // Same float32 arithmetic as fake_quantize, so exported integers equal the simulation's.
  at::Tensor s = broadcastable(p.scale.to(x.device(), at::kFloat), x, spec);
  at::Tensor zp = broadcastable(p.zero_point.to(x.device(), at::kFloat), x, spec);
  at::Tensor q = at::round(x.detach().to(at::kFloat) / s) + zp;
  // Through int64: float32 cannot represent the int32 bounds of 32-bit (bias) ranges exactly.
  return at::clamp(q.to(at::kLong), spec.qmin(), spec.qmax()).to(at::kInt);
}

at::Tensor fake_quantize(const at::Tensor& x, const QParams& p, const QSpec& spec) {
  if (per_tensor(spec))
    if (const auto perm = contiguous_permutation(x); !perm.empty())  // Note [Dense layouts]
      return fake_quantize(x.permute(perm), p, spec).permute(inverse(perm));
  if (spec.is_float8()) {  // Note [Float8 elements]
    const at::Tensor s = broadcastable(p.scale.to(x.device(), at::kFloat), x, spec);
    const at::Tensor v = x.to(at::kFloat) / s;
    const at::Tensor fq = (round_to_float8(v.detach(), spec.element) * s).to(x.scalar_type());
    if (!x.requires_grad() && !s.requires_grad()) return fq;
    // Straight-through inside the saturation range, as for integers inside the clamp range.
    const at::Tensor inside = (v.detach().abs() <= float8_max(spec.element)).to(x.scalar_type());
    return fq + (x - x.detach()) * inside;
  }
  const bool param_grad = p.scale.requires_grad() || p.zero_point.requires_grad();
  if (!param_grad) {
    if (QuantKernels* k = kernels_for(x, p.scale, spec)) {
      QuantArgs a = make_args(x, p.scale, p.zero_point, spec);
      return x.requires_grad() ? FakeQuantizeFn::apply(x, std::move(a)) : k->fake_quantize(a);
    }
    if (!x.requires_grad())
      if (at::Tensor fq = detail::cpu_fake_quantize(x, p, spec); fq.defined()) return fq;
  }
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

at::Tensor lsq_fake_quantize(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                             const QSpec& spec) {
  if (spec.is_float8())
    throw Error("lsq_fake_quantize: LSQ learns the step of an integer grid; " + spec.describe() + " has none");
  if (per_tensor(spec))
    if (const auto perm = contiguous_permutation(x); !perm.empty())  // Note [Dense layouts]
      return lsq_fake_quantize(x.permute(perm), scale, zero_point, spec).permute(inverse(perm));
  // The kernels' backward sums the scale's gradient with atomics, in an order that varies from
  // run to run: under ATen's deterministic switch ([qat] deterministic) the reference runs.
  if (kernels_for(x, scale, spec) && zero_point.numel() == scale.numel() &&
      !at::globalContext().deterministicAlgorithms())
    return LsqFn::apply(x, scale, zero_point, make_args(x, scale, zero_point, spec));
  const at::Tensor s = broadcastable(scale.to(x.device()), x, spec);
  const at::Tensor zp = broadcastable(zero_point.to(x.device(), x.scalar_type()), x, spec);
  const at::Tensor v = at::clamp(x / s + zp, double(spec.qmin()), double(spec.qmax()));
  return (v + (at::round(v) - v).detach() - zp) * s;
}

at::Tensor soft_round_quantize(const at::Tensor& x, const at::Tensor& v, const QParams& p, const QSpec& spec,
                               double zeta, double gamma) {
  if (spec.is_float8())
    throw Error("soft_round_quantize: soft rounding chooses between integer grid points; " + spec.describe() +
                " has none");
  if (kernels_for(x, p.scale, spec) && v.sizes() == x.sizes() && v.scalar_type() == at::kFloat &&
      v.device() == x.device())
    return SoftRoundFn::apply(v, make_args(x, p.scale, p.zero_point, spec), zeta, gamma);
  const at::Tensor s = broadcastable(p.scale.to(x.device(), x.scalar_type()), x, spec);
  const at::Tensor zp = broadcastable(p.zero_point.to(x.device(), x.scalar_type()), x, spec);
  const at::Tensor h = at::clamp(at::sigmoid(v) * (zeta - gamma) + gamma, 0, 1);
  const at::Tensor q = at::clamp(at::floor(x.detach() / s) + h + zp, double(spec.qmin()), double(spec.qmax()));
  return (q - zp) * s;
}

std::pair<at::Tensor, at::Tensor> range_per_param(const at::Tensor& x_in, const QSpec& spec) {
  at::Tensor x = x_in.detach();
  if (per_tensor(spec))
    if (const auto perm = contiguous_permutation(x); !perm.empty()) x = x.permute(perm);  // Note [Dense layouts]
  if (!x.is_floating_point()) x = x.to(at::kFloat);
  const std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  const ParamLayout layout = param_layout(x, spec);  // an Error for an axis x does not have
  if (x.scalar_type() == at::kFloat && x.numel() > 0) {
    if (QuantKernels* k = quant_kernels(x.device().type())) {
      auto [lo, hi] = k->range_per_param(x.contiguous(), layout);
      // Kernels return parameter order (Note [Parameter layout]), not quant_rows' row order.
      const std::vector<std::int64_t> pshape = spec.group_size > 0 ? group_param_shape(x, spec)
                                               : spec.per_channel  ? std::vector<std::int64_t>{-1}
                                                                   : std::vector<std::int64_t>{};
      return {lo.reshape(pshape), hi.reshape(pshape)};
    }
  }
  at::Tensor lo, hi;
  if (!spec.per_channel && spec.group_size == 0 && x.numel() > 0) {
    // Over the whole tensor ATen reduces in parallel; over dim 1 of a [1, N] view it took 18
    // times as long (154 MB: 4.8 ms against 86 ms on 2 cores).
    std::tie(lo, hi) = at::aminmax(x);
    return {lo.to(at::kFloat), hi.to(at::kFloat)};
  }
  const at::Tensor rows = quant_rows(x, spec);
  if (spec.group_size > 0 && x.size(group_axis_of(x, spec)) % spec.group_size != 0) {
    // quant_rows zero-pads the ragged last block; the range covers real elements only.
    const at::Tensor real = quant_rows(at::ones_like(x), spec) > 0;
    const double inf = std::numeric_limits<double>::infinity();
    lo = at::where(real, rows, inf).amin(1);
    hi = at::where(real, rows, -inf).amax(1);
  } else {
    std::tie(lo, hi) = at::aminmax(rows, 1);
  }
  return {rows_to_params(lo.to(at::kFloat), shape, spec), rows_to_params(hi.to(at::kFloat), shape, spec)};
}

}  // namespace sparsebit
