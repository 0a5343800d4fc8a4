// Resize (opsets 10-19: nearest/linear/cubic, every coordinate_transformation_mode, roi,
// exclude_outside, axes, keep_aspect_ratio_policy) and the deprecated Upsample. Both quantize
// their input, as the original toolkit's resize module did.
//
// Note [Separable resize]
// Every mode is separable: an output sample along one axis is a weighted sum of at most four
// input samples along that axis. So each resized axis becomes index_select of the taps times
// their weights, summed, which is exact for all modes, runs on any device and stays
// differentiable. Axes are resized innermost first, as the spec's reference interpolates.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

const std::vector<InputSpec> kQuantizeInput{{InputRole::kActivation, 0}};

struct ResizeMode {
  std::string mode = "nearest";       // nearest | linear | cubic
  std::string coords = "half_pixel";  // coordinate_transformation_mode
  std::string nearest = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
};

/// Resizes axis `axis` of x from n to `out` samples; `scale` is out/n as the spec defines it
/// (the given scale, or out/n when sizes were given); roi = {start, end} for tf_crop_and_resize.
/// One axis of Note [Separable resize].
at::Tensor resize_axis(const at::Tensor& x, std::int64_t axis, std::int64_t out, double scale, const ResizeMode& m,
                       std::pair<double, double> roi) {
  const std::int64_t n = x.size(axis);
  const double out_len = scale * static_cast<double>(n);  // the reference's (possibly fractional) length
  std::vector<double> pos(static_cast<std::size_t>(out));
  std::vector<bool> outside(static_cast<std::size_t>(out), false);
  bool identity = out == n;
  for (std::int64_t i = 0; i < out; ++i) {
    const double xi = static_cast<double>(i);
    double p = 0;
    if (m.coords == "half_pixel") p = (xi + 0.5) / scale - 0.5;
    else if (m.coords == "pytorch_half_pixel") p = out_len > 1 ? (xi + 0.5) / scale - 0.5 : -0.5;
    else if (m.coords == "align_corners") p = out_len == 1 ? 0.0 : xi * static_cast<double>(n - 1) / (out_len - 1);
    else if (m.coords == "asymmetric") p = xi / scale;
    else if (m.coords == "tf_half_pixel_for_nn") p = (xi + 0.5) / scale;
    else if (m.coords == "half_pixel_symmetric") {
      const double adj = static_cast<double>(out) / out_len, center = static_cast<double>(n) / 2;
      p = center * (1 - adj) + (xi + 0.5) / scale - 0.5;
    } else {  // tf_crop_and_resize
      p = out_len == 1 ? (roi.second - roi.first) * static_cast<double>(n - 1) / 2
                       : xi * (roi.second - roi.first) * static_cast<double>(n - 1) / (out_len - 1);
      p += roi.first * static_cast<double>(n - 1);
      outside[static_cast<std::size_t>(i)] = p < 0 || p > static_cast<double>(n - 1);
    }
    pos[static_cast<std::size_t>(i)] = p;
    identity = identity && p == xi && !outside[static_cast<std::size_t>(i)];
  }
  if (identity) return x;

  // Taps and weights per output sample, built on the host in double precision.
  const int taps = m.mode == "nearest" ? 1 : m.mode == "linear" ? 2 : 4;
  std::vector<std::int64_t> index(static_cast<std::size_t>(out * taps));
  std::vector<double> weight(static_cast<std::size_t>(out * taps));
  auto clamp_index = [n](std::int64_t v) { return std::clamp<std::int64_t>(v, 0, n - 1); };
  for (std::int64_t i = 0; i < out; ++i) {
    const double p = pos[static_cast<std::size_t>(i)];
    const double f = std::floor(p);
    const double r = p - f;
    const auto x0 = static_cast<std::int64_t>(f);
    std::int64_t* idx = &index[static_cast<std::size_t>(i * taps)];
    double* w = &weight[static_cast<std::size_t>(i * taps)];
    if (m.mode == "nearest") {
      bool up = false;
      if (r > 0) {
        if (m.nearest == "round_prefer_floor") up = r > 0.5;
        else if (m.nearest == "round_prefer_ceil") up = r >= 0.5;
        else if (m.nearest == "ceil") up = true;
      }
      idx[0] = clamp_index(up ? x0 + 1 : x0);
      w[0] = 1;
    } else if (m.mode == "linear") {
      idx[0] = clamp_index(x0);
      idx[1] = clamp_index(x0 + 1);
      w[0] = 1 - r;
      w[1] = r;
    } else {
      const double a = m.cubic_a;
      auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };  // 1 <= d < 2
      auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };       // 0 <= d <= 1
      const double c[4] = {far(r + 1), near(r), near(1 - r), far(2 - r)};
      double sum = 0;
      for (int t = 0; t < 4; ++t) {
        const std::int64_t src = x0 - 1 + t;
        idx[t] = clamp_index(src);
        w[t] = m.exclude_outside && (src < 0 || src >= n) ? 0.0 : c[t];
        sum += w[t];
      }
      if (m.exclude_outside && sum != 0)
        for (int t = 0; t < 4; ++t) w[t] /= sum;
    }
  }
  const auto dev = x.device();
  at::Tensor idx_t = at::tensor(index, at::kLong).reshape({out, taps}).to(dev);
  at::Tensor y;
  if (taps == 1) {
    y = x.index_select(axis, idx_t.select(1, 0).contiguous());
  } else {
    // Integer inputs interpolate in float and round back at the end.
    const at::Tensor src = x.is_floating_point() ? x : x.to(at::kFloat);
    at::Tensor w_t = at::tensor(weight, at::kDouble).reshape({out, taps}).to(dev, src.scalar_type());
    std::vector<std::int64_t> wshape(static_cast<std::size_t>(x.dim()), 1);
    wshape[static_cast<std::size_t>(axis)] = out;
    for (int t = 0; t < taps; ++t) {
      at::Tensor part = src.index_select(axis, idx_t.select(1, t).contiguous()) * w_t.select(1, t).reshape(wshape);
      y = t == 0 ? part : y + part;
    }
  }
  if (m.coords == "tf_crop_and_resize") {
    std::vector<std::uint8_t> mask_v(outside.begin(), outside.end());
    std::vector<std::int64_t> mshape(static_cast<std::size_t>(x.dim()), 1);
    mshape[static_cast<std::size_t>(axis)] = out;
    at::Tensor mask = at::tensor(at::ArrayRef<std::uint8_t>(mask_v)).to(dev, at::kBool).reshape(mshape);
    y = at::where(mask, at::scalar_tensor(m.extrapolation, y.options()), y);
  }
  return y.scalar_type() == x.scalar_type() ? y : y.round().to(x.scalar_type());
}

class QResize final : public NodeQModule {
 public:
  explicit QResize(const OpContext& c)
      : NodeQModule(c),
        opset_(c.opset),
        axes_(c.node.attr_ints("axes")),
        policy_(c.node.attr_string("keep_aspect_ratio_policy", "stretch")) {
    m_.mode = c.node.attr_string("mode", "nearest");
    m_.coords = c.node.attr_string("coordinate_transformation_mode", c.opset < 11 ? "asymmetric" : "half_pixel");
    m_.nearest = c.node.attr_string("nearest_mode", c.opset < 11 ? "floor" : "round_prefer_floor");
    m_.cubic_a = c.node.attr_float("cubic_coeff_a", -0.75);
    m_.exclude_outside = c.node.attr_int("exclude_outside", 0) != 0;
    m_.extrapolation = c.node.attr_float("extrapolation_value", 0.0);
    auto one_of = [&](const std::string& key, const std::string& v, std::initializer_list<const char*> allowed) {
      for (const char* a : allowed)
        if (v == a) return;
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      throw Error(describe() + ": " + key + " '" + v + "' is not one of " + list);
    };
    one_of("mode", m_.mode, {"nearest", "linear", "cubic"});
    one_of("coordinate_transformation_mode", m_.coords,
           {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
            "tf_half_pixel_for_nn", "tf_crop_and_resize"});
    one_of("nearest_mode", m_.nearest, {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"});
    one_of("keep_aspect_ratio_policy", policy_, {"stretch", "not_larger", "not_smaller"});
    if (c.node.attr_int("antialias", 0) != 0)
      throw Error(describe() + ": antialias=1 is not supported; export with antialias off");
  }
  std::vector<InputSpec> input_specs() const override { return reading_on_host(kQuantizeInput, {1, 2, 3}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t rank = x.dim();
    auto present = [&](std::size_t i) { return i < in.size() && in[i].defined() && in[i].numel() > 0; };
    // Opset 10: (X, scales). Later: (X, roi, scales, sizes), empty tensors meaning absent.
    const std::size_t scales_at = opset_ < 11 ? 1 : 2, sizes_at = 3;
    std::vector<std::int64_t> axes = axes_;
    if (axes.empty())
      for (std::int64_t d = 0; d < rank; ++d) axes.push_back(d);
    for (auto& a : axes) a = normalize_axis(a, rank, node());
    const std::size_t k = axes.size();

    std::vector<double> scales(k, 1.0);
    std::vector<std::int64_t> out(k);
    if (present(sizes_at)) {
      if (present(scales_at)) throw Error(describe() + ": give either scales or sizes, not both");
      auto sizes = int_list(in[sizes_at], node(), "sizes");
      if (sizes.size() != k)
        throw Error(describe() + ": sizes has " + std::to_string(sizes.size()) + " values for " + std::to_string(k) +
                    " axes");
      for (std::size_t i = 0; i < k; ++i) {
        if (sizes[i] < 0) throw Error(describe() + ": sizes must be non-negative");
        scales[i] = static_cast<double>(sizes[i]) / static_cast<double>(x.size(axes[i]));
        out[i] = sizes[i];
      }
      if (policy_ != "stretch") {
        double s = scales[0];
        for (double v : scales) s = policy_ == "not_larger" ? std::min(s, v) : std::max(s, v);
        for (std::size_t i = 0; i < k; ++i) {
          scales[i] = s;
          out[i] = static_cast<std::int64_t>(std::round(s * static_cast<double>(x.size(axes[i]))));
        }
      }
    } else if (present(scales_at)) {
      at::Tensor s = in[scales_at].to(at::kCPU, at::kDouble).contiguous().reshape({-1});
      if (static_cast<std::size_t>(s.numel()) != k)
        throw Error(describe() + ": scales has " + std::to_string(s.numel()) + " values for " + std::to_string(k) +
                    " axes");
      for (std::size_t i = 0; i < k; ++i) {
        scales[i] = s.data_ptr<double>()[i];
        if (!(scales[i] > 0) || !std::isfinite(scales[i])) throw Error(describe() + ": scales must be positive");
      }
    } else {
      throw Error(describe() + ": needs scales or sizes");
    }
    std::vector<double> roi;
    if (m_.coords == "tf_crop_and_resize") {
      if (!present(1)) throw Error(describe() + ": tf_crop_and_resize needs roi");
      at::Tensor r = in[1].to(at::kCPU, at::kDouble).contiguous().reshape({-1});
      roi.assign(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
      if (roi.size() != 2 * k && roi.size() != 2 * static_cast<std::size_t>(rank))
        throw Error(describe() + ": roi must hold start and end for every resized axis");
    }
    if (!present(sizes_at)) {
      for (std::size_t i = 0; i < k; ++i) {
        double len = static_cast<double>(x.size(axes[i])) * scales[i];
        if (!roi.empty()) {
          const std::size_t j = roi.size() == 2 * k ? i : static_cast<std::size_t>(axes[i]);
          len *= roi[j + roi.size() / 2] - roi[j];
        }
        if (!(len < 1e12)) throw Error(describe() + ": output size overflows");
        out[i] = static_cast<std::int64_t>(std::floor(len));
      }
    }
    at::Tensor y = x;
    for (std::size_t i = k; i-- > 0;) {
      std::pair<double, double> r{0.0, 1.0};
      if (!roi.empty()) {
        const std::size_t j = roi.size() == 2 * k ? i : static_cast<std::size_t>(axes[i]);
        r = {roi[j], roi[j + roi.size() / 2]};
      }
      y = resize_axis(y, axes[i], out[i], scales[i], m_, r);
    }
    return {y.data_ptr() == x.data_ptr() ? y.clone() : y};
  }

 private:
  std::int64_t opset_;
  std::vector<std::int64_t> axes_;
  std::string policy_;
  ResizeMode m_;
};

/// Upsample (opsets 7-9): asymmetric coordinates; nearest repeats samples (floor).
class QUpsample final : public NodeQModule {
 public:
  explicit QUpsample(const OpContext& c) : NodeQModule(c), scales_attr_(c.node.attr_floats("scales")) {
    m_.mode = c.node.attr_string("mode", "nearest");
    if (m_.mode == "bilinear") m_.mode = "linear";
    if (m_.mode != "nearest" && m_.mode != "linear") throw Error(describe() + ": mode must be nearest or linear");
    m_.coords = "asymmetric";
    m_.nearest = "floor";
  }
  std::vector<InputSpec> input_specs() const override { return reading_on_host(kQuantizeInput, {1}); }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    std::vector<double> scales = scales_attr_;
    if (in.size() > 1 && in[1].defined()) {
      at::Tensor s = in[1].to(at::kCPU, at::kDouble).contiguous().reshape({-1});
      scales.assign(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
    }
    if (static_cast<std::int64_t>(scales.size()) != x.dim())
      throw Error(describe() + ": scales must hold one value per input dimension");
    at::Tensor y = x;
    for (std::int64_t d = x.dim(); d-- > 0;) {
      const double s = scales[static_cast<std::size_t>(d)];
      if (!(s > 0) || !std::isfinite(s)) throw Error(describe() + ": scales must be positive");
      const auto out = static_cast<std::int64_t>(std::floor(static_cast<double>(x.size(d)) * s));
      y = resize_axis(y, d, out, s, m_, {0.0, 1.0});
    }
    return {y.data_ptr() == x.data_ptr() ? y.clone() : y};
  }

 private:
  std::vector<double> scales_attr_;
  ResizeMode m_;
};

/// Resize and Upsample keep the channels when their scale along the channel axis is 1.
class ResizeChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0) return {};
    const bool resize = q.node.op_type == "Resize";
    if (resize && q.node.has_input(3)) return {};  // output sizes instead of scales
    const std::size_t scales_input = resize && q.opset >= 11 ? 2 : 1;
    auto scales = q.node.has_input(scales_input) ? q.constant(q.node.inputs[scales_input]) : std::nullopt;
    if (!scales && q.node.has_attr("scales")) scales = at::tensor(q.node.attr_floats("scales"));
    if (!scales || scales->numel() != rank || scales->to(at::kDouble)[q.axis].item<double>() != 1.0) return {};
    return carried_to_output(q.axis);
  }
};

// Upsample became Resize at 10 (and left the standard: one found in a newer model still means
// Upsample-9).
class UpsampleLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {10}; }
  std::int64_t read_as(std::int64_t opset) const override { return std::min<std::int64_t>(opset, 9); }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    std::string scales;
    if (n.has_attr("scales")) {  // Upsample-7
      const auto v = n.attr_floats("scales");
      scales = c.constant(n, "scales", at::tensor(std::vector<float>(v.begin(), v.end()), at::kFloat));
      n.attributes.erase("scales");
    } else if (n.has_input(1)) {  // Upsample-9
      scales = n.inputs[1];
    } else {
      c.refuse(n, "it has neither a 'scales' attribute nor a scales input");
    }
    std::string mode = n.attr_string("mode", "nearest");
    if (mode == "bilinear") mode = "linear";
    if (mode != "nearest" && mode != "linear") c.refuse(n, "mode '" + mode + "' has no Resize equivalent");
    n.op_type = "Resize";
    n.attributes = {{"mode", Attribute::of_string(mode)}};
    n.inputs = {n.inputs.at(0), scales};
    c.note(n, "Upsample -> Resize");
  }
};

// Resize-10 sampled with asymmetric coordinates (and, for nearest, rounded down); Resize-11 made
// both attributes with other defaults and put roi before scales.
class ResizeLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {11}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (n.inputs.size() != 2) c.refuse(n, "Resize-10 takes exactly 2 inputs (X, scales)");
    const std::string roi =  // optional from 13
        c.target() >= 13 ? std::string() : c.constant(n, "roi", at::empty({0}, at::kFloat));
    n.inputs = {n.inputs[0], roi, n.inputs[1]};
    n.attributes["coordinate_transformation_mode"] = Attribute::of_string("asymmetric");
    if (n.attr_string("mode", "nearest") == "nearest") n.attributes["nearest_mode"] = Attribute::of_string("floor");
    c.note(n, "inputs (X, scales) -> (X, roi, scales), asymmetric coordinates made explicit");
  }
};

void register_all(Registrar& r) {
  r.add_op<QResize>("Resize");
  r.add_op<QUpsample>("Upsample");
  r.add_op_traits<TraitsOf<ResizeChannels, ResizeLift>>("Resize");
  r.add_op_traits<TraitsOf<ResizeChannels, UpsampleLift>>("Upsample");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.resize", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
