// Detection and vision heads: NonMaxSuppression, RoiAlign, GridSample, MaxUnpool.
//
// None of them quantizes anything: their inputs are boxes, scores, indices and sampling grids
// (where an 8-bit grid would move boxes and sample points), and no backend has an integer
// kernel for them. RoiAlign and GridSample read feature maps that the ops before them leave
// quantized or float as their own roles say.

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

// NonMaxSuppression: per batch and class, boxes by descending score (ties: lower index first),
// kept greedily unless their IoU with a kept box exceeds iou_threshold; scores must exceed
// score_threshold when it is given. Output rows [batch, class, box], batch then class order.
class QNonMaxSuppression final : public NodeQModule {
 public:
  explicit QNonMaxSuppression(const OpContext& c)
      : NodeQModule(c), center_point_box_(c.node.attr_int("center_point_box", 0) != 0) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    auto opt = [&](std::size_t i) { return i < in.size() && in[i].defined() && in[i].numel() > 0; };
    at::Tensor boxes = in.at(0).to(at::kCPU, at::kFloat).contiguous();
    at::Tensor scores = in.at(1).to(at::kCPU, at::kFloat).contiguous();
    if (boxes.dim() != 3 || boxes.size(2) != 4)
      throw Error(describe() + ": boxes must be [batch, boxes, 4], got " + c10::str(boxes.sizes()));
    if (scores.dim() != 3 || scores.size(0) != boxes.size(0) || scores.size(2) != boxes.size(1))
      throw Error(describe() + ": scores must be [batch, classes, boxes] = [" + std::to_string(boxes.size(0)) +
                  ", C, " + std::to_string(boxes.size(1)) + "], got " + c10::str(scores.sizes()));
    const std::int64_t max_out = opt(2) ? in[2].reshape({-1})[0].item<std::int64_t>() : 0;
    const float iou_threshold = opt(3) ? in[3].reshape({-1})[0].item<float>() : 0.f;
    const bool has_score_threshold = opt(4);
    const float score_threshold = has_score_threshold ? in[4].reshape({-1})[0].item<float>() : 0.f;
    if (iou_threshold < 0 || iou_threshold > 1)
      throw Error(describe() + ": iou_threshold " + std::to_string(iou_threshold) + " is outside [0, 1]");

    // Corners as (y1, x1, y2, x2) with y1 <= y2, x1 <= x2, whatever the input's convention.
    at::Tensor corners;
    if (center_point_box_) {
      auto b = boxes.unbind(2);  // x_center, y_center, width, height
      corners = at::stack({b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2}, 2);
    } else {
      auto b = boxes.unbind(2);
      corners = at::stack(
          {at::minimum(b[0], b[2]), at::minimum(b[1], b[3]), at::maximum(b[0], b[2]), at::maximum(b[1], b[3])}, 2);
    }
    corners = corners.contiguous();
    std::vector<std::int64_t> out;
    const std::int64_t batches = scores.size(0), classes = scores.size(1), n = scores.size(2);
    auto cs = corners.accessor<float, 3>();
    auto ss = scores.accessor<float, 3>();
    for (std::int64_t b = 0; b < batches && max_out > 0; ++b) {
      for (std::int64_t c = 0; c < classes; ++c) {
        std::vector<std::int64_t> order;
        for (std::int64_t i = 0; i < n; ++i)
          if (!has_score_threshold || ss[b][c][i] > score_threshold) order.push_back(i);
        std::stable_sort(order.begin(), order.end(),
                         [&](std::int64_t l, std::int64_t r) { return ss[b][c][l] > ss[b][c][r]; });
        std::vector<std::int64_t> kept;
        for (std::int64_t i : order) {
          if (static_cast<std::int64_t>(kept.size()) >= max_out) break;
          bool keep = true;
          for (std::int64_t k : kept)
            if (iou(cs[b][i], cs[b][k]) > iou_threshold) {
              keep = false;
              break;
            }
          if (keep) kept.push_back(i);
        }
        for (std::int64_t i : kept) out.insert(out.end(), {b, c, i});
      }
    }
    at::Tensor result = at::tensor(out, at::kLong).reshape({-1, 3});
    return {result.to(in.at(0).device())};
  }

 private:
  template <class Row>
  static float iou(const Row& a, const Row& b) {
    const float area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
    if (area_a <= 0 || area_b <= 0) return 0;
    const float h = std::min(a[2], b[2]) - std::max(a[0], b[0]), w = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    if (h <= 0 || w <= 0) return 0;
    const float inter = h * w;
    return inter / (area_a + area_b - inter);
  }
  bool center_point_box_;
};

// RoiAlign: each region's bins averaged (or maxed) over sampling_ratio^2 bilinear samples
// (adaptive ceil(roi / bins) when 0). Samples follow the Caffe2/Detectron rules that ONNX
// specifies: outside [-1, size] a sample is 0, coordinates are clamped at 0 and at size - 1.
// In max mode each sample contributes the largest of its four weighted corner values, as
// ONNX Runtime computes it.
class QRoiAlign final : public NodeQModule {
 public:
  explicit QRoiAlign(const OpContext& c)
      : NodeQModule(c),
        mode_(c.node.attr_string("mode", "avg")),
        out_h_(c.node.attr_int("output_height", 1)),
        out_w_(c.node.attr_int("output_width", 1)),
        sampling_ratio_(c.node.attr_int("sampling_ratio", 0)),
        spatial_scale_(c.node.attr_float("spatial_scale", 1.0)) {
    const std::string ctm =
        c.node.attr_string("coordinate_transformation_mode", c.opset >= 16 ? "half_pixel" : "output_half_pixel");
    if (ctm != "half_pixel" && ctm != "output_half_pixel")
      throw Error(describe() + ": coordinate_transformation_mode '" + ctm +
                  "' is not one of half_pixel, output_half_pixel");
    half_pixel_ = ctm == "half_pixel";
    if (mode_ != "avg" && mode_ != "max") throw Error(describe() + ": mode '" + mode_ + "' is not one of avg, max");
    if (out_h_ < 1 || out_w_ < 1 || sampling_ratio_ < 0)
      throw Error(describe() + ": output_height and output_width must be >= 1 and sampling_ratio >= 0");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() != 4) throw Error(describe() + ": X must be [N, C, H, W], got rank " + std::to_string(x.dim()));
    at::Tensor rois = in.at(1).to(at::kCPU, at::kDouble).contiguous();
    at::Tensor batch_index = in.at(2).to(at::kCPU, at::kLong).reshape({-1});
    if (rois.dim() != 2 || rois.size(1) != 4 || batch_index.numel() != rois.size(0))
      throw Error(describe() + ": rois must be [R, 4] with R batch indices, got " + c10::str(rois.sizes()) + " and " +
                  std::to_string(batch_index.numel()));
    const std::int64_t height = x.size(2), width = x.size(3);
    std::vector<at::Tensor> out;
    auto r = rois.accessor<double, 2>();
    for (std::int64_t i = 0; i < rois.size(0); ++i) {
      const std::int64_t b = batch_index[i].item<std::int64_t>();
      if (b < 0 || b >= x.size(0))
        throw Error(describe() + ": batch index " + std::to_string(b) + " of roi " + std::to_string(i) +
                    " is outside the batch of " + std::to_string(x.size(0)));
      const double offset = half_pixel_ ? 0.5 : 0.0;
      const double x0 = r[i][0] * spatial_scale_ - offset, y0 = r[i][1] * spatial_scale_ - offset;
      double roi_w = r[i][2] * spatial_scale_ - offset - x0, roi_h = r[i][3] * spatial_scale_ - offset - y0;
      if (!half_pixel_) {
        roi_w = std::max(roi_w, 1.0);
        roi_h = std::max(roi_h, 1.0);
      }
      const std::int64_t grid_h =
          sampling_ratio_ > 0 ? sampling_ratio_ : static_cast<std::int64_t>(std::ceil(roi_h / out_h_));
      const std::int64_t grid_w =
          sampling_ratio_ > 0 ? sampling_ratio_ : static_cast<std::int64_t>(std::ceil(roi_w / out_w_));
      auto ya = axis(y0, roi_h / out_h_, out_h_, grid_h, height);
      auto xa = axis(x0, roi_w / out_w_, out_w_, grid_w, width);
      at::Tensor fm = x[b];  // [C, H, W]
      auto corner = [&](const Axis& ay, bool y_high, const Axis& ax, bool x_high) {
        at::Tensor v = fm.index_select(1, (y_high ? ay.high : ay.low).to(x.device()))
                           .index_select(2, (x_high ? ax.high : ax.low).to(x.device()));
        at::Tensor w = (y_high ? ay.w_high : ay.w_low).unsqueeze(1) * (x_high ? ax.w_high : ax.w_low).unsqueeze(0);
        return v * w.to(v.options());
      };
      at::Tensor ll = corner(ya, false, xa, false), lh = corner(ya, false, xa, true);
      at::Tensor hl = corner(ya, true, xa, false), hh = corner(ya, true, xa, true);
      const std::int64_t ch = x.size(1);
      if (mode_ == "avg") {
        at::Tensor s = (ll + lh + hl + hh).reshape({ch, out_h_, grid_h, out_w_, grid_w}).sum({2, 4});
        out.push_back(s / static_cast<double>(std::max<std::int64_t>(grid_h * grid_w, 1)));
      } else {
        at::Tensor m = at::maximum(at::maximum(ll, lh), at::maximum(hl, hh));
        out.push_back(m.reshape({ch, out_h_, grid_h, out_w_, grid_w}).amax({2, 4}));
      }
    }
    if (out.empty()) return {at::zeros({0, x.size(1), out_h_, out_w_}, x.options())};
    return {at::stack(out, 0)};
  }

 private:
  struct Axis {
    at::Tensor low, high;      // sample indices (long)
    at::Tensor w_low, w_high;  // their weights (double), 0 for samples outside the map
  };

  // Sample positions along one axis: bins of `bin` starting at `start`, `grid` samples per bin.
  static Axis axis(double start, double bin, std::int64_t bins, std::int64_t grid, std::int64_t size) {
    const std::int64_t n = bins * std::max<std::int64_t>(grid, 1);
    std::vector<std::int64_t> lo(n), hi(n);
    std::vector<double> wl(n), wh(n);
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t p = k / std::max<std::int64_t>(grid, 1), g = k % std::max<std::int64_t>(grid, 1);
      double v = start + p * bin + (g + 0.5) * bin / static_cast<double>(std::max<std::int64_t>(grid, 1));
      if (v < -1.0 || v > static_cast<double>(size)) {
        lo[k] = hi[k] = 0;
        wl[k] = wh[k] = 0;
        continue;
      }
      v = std::max(v, 0.0);
      std::int64_t l = static_cast<std::int64_t>(v), h = l + 1;
      if (l >= size - 1) {
        l = h = size - 1;
        v = static_cast<double>(l);
      }
      lo[k] = l;
      hi[k] = h;
      wh[k] = v - static_cast<double>(l);
      wl[k] = 1.0 - wh[k];
    }
    return {at::tensor(lo, at::kLong), at::tensor(hi, at::kLong), at::tensor(wl, at::kDouble),
            at::tensor(wh, at::kDouble)};
  }

  std::string mode_;
  std::int64_t out_h_, out_w_, sampling_ratio_;
  double spatial_scale_;
  bool half_pixel_ = true;
};

// GridSample: ATen's grid sampler (2-D and 3-D), with the mode names of opset 16
// (bilinear, bicubic) and of opset 20 (linear, cubic).
class QGridSample final : public NodeQModule {
 public:
  explicit QGridSample(const OpContext& c) : NodeQModule(c), align_corners_(c.node.attr_int("align_corners", 0) != 0) {
    const std::string mode = c.node.attr_string("mode", c.opset >= 20 ? "linear" : "bilinear");
    if (mode == "bilinear" || mode == "linear") mode_ = 0;
    else if (mode == "nearest") mode_ = 1;
    else if (mode == "bicubic" || mode == "cubic") mode_ = 2;
    else throw Error(describe() + ": mode '" + mode + "' is not one of linear, nearest, cubic");
    const std::string padding = c.node.attr_string("padding_mode", "zeros");
    if (padding == "zeros") padding_ = 0;
    else if (padding == "border") padding_ = 1;
    else if (padding == "reflection") padding_ = 2;
    else throw Error(describe() + ": padding_mode '" + padding + "' is not one of zeros, border, reflection");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& grid = in.at(1);
    if ((x.dim() != 4 && x.dim() != 5) || grid.dim() != x.dim() || grid.size(-1) != x.dim() - 2)
      throw Error(describe() + ": X " + c10::str(x.sizes()) + " and grid " + c10::str(grid.sizes()) +
                  " do not fit (expected N x C x spatial and N x spatial x " + std::to_string(x.dim() - 2) + ")");
    if (mode_ == 2 && x.dim() == 5) throw Error(describe() + ": cubic mode takes 2-D spatial inputs only");
    return {at::grid_sampler(x, grid.to(x.scalar_type()), mode_, padding_, align_corners_)};
  }

 private:
  bool align_corners_;
  std::int64_t mode_ = 0, padding_ = 0;
};

// MaxUnpool: X's values written at the flat positions I holds (MaxPool's indices over the whole
// N x C x spatial tensor), zeros elsewhere; the output shape is `output_shape` when given.
class QMaxUnpool final : public NodeQModule {
 public:
  explicit QMaxUnpool(const OpContext& c)
      : NodeQModule(c),
        kernel_(c.node.attr_ints("kernel_shape")),
        strides_(c.node.attr_ints("strides")),
        pads_(c.node.attr_ints("pads")) {
    if (kernel_.empty()) throw Error(describe() + ": kernel_shape is required");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& index = in.at(1);
    const std::size_t r = kernel_.size();
    if (x.dim() != static_cast<std::int64_t>(r) + 2 || index.sizes() != x.sizes())
      throw Error(describe() + ": X " + c10::str(x.sizes()) + " and I " + c10::str(index.sizes()) +
                  " must have the same shape, N x C and " + std::to_string(r) + " spatial dims");
    std::vector<std::int64_t> shape{x.size(0), x.size(1)};  // the unpooled shape I refers to
    for (std::size_t i = 0; i < r; ++i) {
      const std::int64_t s = strides_.empty() ? 1 : strides_[i];
      const std::int64_t p = pads_.empty() ? 0 : pads_[i] + pads_[i + r];
      shape.push_back((x.size(static_cast<std::int64_t>(i) + 2) - 1) * s + kernel_[i] - p);
    }
    std::int64_t total = 1;
    for (auto d : shape) total *= d;
    at::Tensor flat = index.reshape({-1}).to(at::kLong);
    if (flat.numel() > 0 && (flat.min().item<std::int64_t>() < 0 || flat.max().item<std::int64_t>() >= total))
      throw Error(describe() + ": an index of I lies outside the unpooled output of " + std::to_string(total) +
                  " values");
    at::Tensor y = at::zeros({total}, x.options()).scatter_(0, flat, x.reshape({-1})).reshape(shape);
    if (in.size() > 2 && in[2].defined()) {  // a larger output_shape extends each spatial dim at its end
      const std::vector<std::int64_t> want = int_list(in[2], node(), "output_shape");
      if (want.size() != shape.size() || want[0] != shape[0] || want[1] != shape[1])
        throw Error(describe() + ": output_shape " + c10::str(at::IntArrayRef(want)) + " does not fit X " +
                    c10::str(x.sizes()));
      std::vector<std::int64_t> pad;
      for (std::size_t i = shape.size(); i-- > 2;) {
        if (want[i] < shape[i])
          throw Error(describe() + ": output_shape " + c10::str(at::IntArrayRef(want)) + " is smaller than the " +
                      "unpooled shape " + c10::str(at::IntArrayRef(shape)));
        pad.insert(pad.end(), {0, want[i] - shape[i]});
      }
      y = at::constant_pad_nd(y, pad, 0);
    }
    return {y};
  }

 private:
  std::vector<std::int64_t> kernel_, strides_, pads_;
};

// 16 added coordinate_transformation_mode, whose default is not the earlier behaviour.
class RoiAlignLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {16}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (n.has_attr("coordinate_transformation_mode")) return;
    n.attributes["coordinate_transformation_mode"] = Attribute::of_string("output_half_pixel");
    c.note(n, "coordinate_transformation_mode = output_half_pixel made explicit");
  }
};

// 20 renamed the modes bilinear and bicubic.
class GridSampleLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {20}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    const std::string mode = n.attr_string("mode", "bilinear");
    n.attributes["mode"] = Attribute::of_string(mode == "bilinear" ? "linear" : mode == "bicubic" ? "cubic" : mode);
    c.note(n, "mode '" + mode + "' renamed");
  }
};

void register_all(Registrar& r) {
  r.add_op<QNonMaxSuppression>("NonMaxSuppression");
  r.add_op<QRoiAlign>("RoiAlign");
  r.add_op<QGridSample>("GridSample");
  r.add_op<QMaxUnpool>("MaxUnpool");
  for (const char* op : {"NonMaxSuppression", "MaxUnpool"}) r.add_op_traits<SameMeaning<>>(op);
  r.add_op_traits<RoiAlignLift>("RoiAlign");
  r.add_op_traits<GridSampleLift>("GridSample");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.vision", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
