// Weight rounding from the layer's inputs (Note [Weights solved from layer inputs] in
// sparsebit/sdk/quantizer.h), for MatMul and Gemm weights of language models:
//
// gptq (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
//   Transformers", ICLR 2023): with H = 2/n sum x x^T over the layer's n input vectors, the
//   weight's columns along the reduction axis are quantized one at a time and each rounding
//   error is spread over the columns not yet quantized through the Cholesky factor of H^-1,
//   which keeps the layer's output error small. Lazy batch updates: the spread inside a block of
//   `block_size` columns is applied at once to the columns after the block. Per-group weights
//   take each group's parameters from its current (already updated) values when the algorithm
//   reaches the group, as the paper's code does; with act_order (columns in decreasing order of
//   H's diagonal) the groups keep their parameters from the original weight ("static groups"),
//   so they stay contiguous blocks that blocked DequantizeLinear and MatMulNBits express.
//   Options: damp (0.01: added to H's diagonal as that fraction of its mean), block_size (128),
//   act_order (false).
//
// rtn: round to nearest on the observer's grid; with clip_search = true each group's range is
//   shrunk to the factor among 1, 1 - 1/grid, ... 1 - max_shrink whose rounding error weighs
//   least on the layer's output, (w - q)^T H_gg (w - q) with H_gg the group's block of H.
//   Options: clip_search (false), grid (20), max_shrink (0.5).
//
// The weight is handled as W [N, K] with K along the reduction axis (MatMul's [K, N] weight is
// transposed); the result is stored once, as integers, and forward() returns it dequantized on
// the grid of qparams().

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::quantizers {
namespace {

/// The parameters of one W [N, K]: scale and zero point [N, G], one column per group of
/// `group` columns (G = 1 and group = K for per-tensor and per-channel).
struct Grid {
  at::Tensor scale, zero_point;  // float [N, G]
  std::int64_t group = 0;
};

class WeightRounding : public Quantizer {
 public:
  WeightRounding(const QuantizerContext& c, const char* name) : spec_(c.spec), where_(c.where), name_(name) {
    if (!spec_.is_weight)
      throw Error(c.options.where() + ": " + name + " rounds weights from their layer's inputs; use it under [w]");
  }

  void initialize(const QParams& observed) override {
    params_ = observed;
    codes_ = at::Tensor();
    hessian_ = at::Tensor();
    samples_ = 0;
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (!params_.defined()) throw Error(where_ + ": quantizer used before calibration");
    if (params_.scale.device() != x.device()) {
      params_.scale = params_.scale.to(x.device());
      params_.zero_point = params_.zero_point.to(x.device());
    }
    if (codes_.defined()) {
      if (x.sizes() != codes_.sizes())
        throw Error(where_ + ": " + name_ + " solved a weight of shape " + c10::str(codes_.sizes()) + ", got shape " +
                    c10::str(x.sizes()));
      if (codes_.device() != x.device()) codes_ = codes_.to(x.device());
      const at::Tensor q = codes_.to(at::kFloat);
      return ((q - expand_param(params_.zero_point.to(at::kFloat), q, spec_)) *
              expand_param(params_.scale.to(at::kFloat), q, spec_))
          .to(x.scalar_type());
    }
    return fake_quantize(x, params_, spec_);
  }

  QParams qparams() const override { return params_; }

  void accumulate_inputs(const at::Tensor& rows_in) {
    const at::Tensor rows = rows_in.detach().to(at::kFloat);
    const std::int64_t n = rows.size(0), k = rows.size(1);
    if (!hessian_.defined()) hessian_ = at::zeros({k, k}, rows.options());
    if (hessian_.size(0) != k)
      throw Error(where_ + ": layer inputs of " + std::to_string(k) + " features after " +
                  std::to_string(hessian_.size(0)));
    if (n == 0) return;
    // Running mean of 2 x x^T, as the reference keeps it (float32 stays well scaled).
    hessian_.mul_(double(samples_) / double(samples_ + n));
    samples_ += n;
    hessian_.addmm_(rows.t(), rows, 1.0, 2.0 / double(samples_));
  }

  // The running mean times its sample count, and the count: both add up over processes.
  std::vector<at::Tensor> input_state() const {
    if (!hessian_.defined()) throw Error(where_ + ": " + name_ + " has no layer inputs to merge");
    return {hessian_ * double(samples_), at::full({1}, double(samples_), hessian_.options().dtype(at::kDouble))};
  }
  void merge_inputs(const std::vector<at::Tensor>& sums) {
    if (sums.size() != 2 || !hessian_.defined() || sums[0].sizes() != hessian_.sizes())
      throw Error(where_ + ": not a " + name_ + " input state of " + c10::str(hessian_.sizes()));
    const double total = sums[1].item<double>();
    if (!(total > 0)) return;
    hessian_ = sums[0].to(hessian_.device(), at::kFloat).div_(total);
    samples_ = static_cast<std::int64_t>(total);
  }

 protected:
  /// W [N, K] from the weight (reduction axis last) and back.
  static at::Tensor to_rows(const at::Tensor& w, std::int64_t axis) { return axis == 0 ? w.t() : w; }

  /// The observer's parameters as a Grid over W [N, K].
  Grid observed_grid(const at::Tensor& w, std::int64_t axis, std::int64_t n, std::int64_t k) const {
    Grid g;
    at::Tensor s = params_.scale.to(w.device(), at::kFloat), z = params_.zero_point.to(w.device(), at::kFloat);
    if (spec_.group_size > 0) {
      if ((spec_.group_axis < 0 ? spec_.group_axis + 2 : spec_.group_axis) != axis)
        throw Error(where_ + ": " + name_ + " needs the groups along the weight's reduction axis " +
                    std::to_string(axis) + " (per-group weights of MatMul and Gemm have them there)");
      g.group = spec_.group_size;
      g.scale = axis == 0 ? s.t() : s;  // params are [G, N] for a [K, N] weight
      g.zero_point = axis == 0 ? z.t() : z;
    } else {
      if (spec_.per_channel && (spec_.channel_axis < 0 ? spec_.channel_axis + 2 : spec_.channel_axis) == axis)
        throw Error(where_ + ": per-channel parameters along the reduction axis cannot be " + name_ + "'s");
      g.group = k;
      g.scale = s.reshape({-1, 1}).expand({n, 1}).contiguous();
      g.zero_point = z.reshape({-1, 1}).expand({n, 1}).contiguous();
    }
    return g;
  }

  /// Parameters of the columns `cols` [N, len] as the observer would make them (minimum and
  /// maximum per row, shrunk by `shrink`).
  std::pair<at::Tensor, at::Tensor> group_params(const at::Tensor& cols, double shrink = 1.0) const {
    auto [lo, hi] = at::aminmax(cols, 1);
    QParams p = qparams_from_range(lo * shrink, hi * shrink, spec_, where_);
    return {p.scale.to(at::kFloat), p.zero_point.to(at::kFloat)};
  }

  /// How far a clip search shrinks ranges: factors 1, 1 - 1/grid, ..., down to 1 - max_shrink.
  struct ClipSearch {
    std::int64_t grid = 20;
    double max_shrink = 0.5;
  };

  static ClipSearch clip_search_options(const Options& o) {
    ClipSearch c{o.get_int("grid", 20), o.get_double("max_shrink", 0.5)};
    if (c.grid < 1) throw Error(o.where() + ": grid must be >= 1");
    if (!(c.max_shrink >= 0 && c.max_shrink < 1)) throw Error(o.where() + ": max_shrink must be in [0, 1)");
    return c;
  }

  /// Parameters of the columns `cols` [N, len], per row, among the observer's ranges shrunk by the
  /// factors of `clip`, with the least rounding error weighed on the layer's output,
  /// (w - q)^T H_gg (w - q) with `hg` the columns' block of H. With `whole` (per-tensor weights)
  /// the range is the whole weight's and the errors of all rows add up.
  std::pair<at::Tensor, at::Tensor> searched_params(const at::Tensor& cols, const at::Tensor& hg,
                                                    const ClipSearch& clip, const at::Tensor* whole = nullptr) const {
    const std::int64_t n = cols.size(0);
    at::Tensor best_err, best_s, best_z;
    for (std::int64_t step = 0; step <= clip.grid && double(step) / double(clip.grid) <= clip.max_shrink + 1e-12;
         ++step) {
      const double shrink = 1.0 - double(step) / double(clip.grid);
      at::Tensor s, z;
      if (whole) {
        auto [lo, hi] = at::aminmax(*whole);
        QParams p = qparams_from_range(lo * shrink, hi * shrink, spec_, where_);
        s = p.scale.to(at::kFloat).expand({n}), z = p.zero_point.to(at::kFloat).expand({n});
      } else {
        std::tie(s, z) = group_params(cols, shrink);
      }
      const at::Tensor d = cols - (quantize(cols, s.unsqueeze(1), z.unsqueeze(1)) - z.unsqueeze(1)) * s.unsqueeze(1);
      at::Tensor err = (d.mm(hg) * d).sum(1);  // per row: its share of the output error
      if (whole) err = err.sum().expand({n});
      if (!best_err.defined()) {
        best_err = err, best_s = s, best_z = z;
        continue;
      }
      const at::Tensor better = err < best_err;
      best_err = at::where(better, err, best_err);
      best_s = at::where(better, s, best_s);
      best_z = at::where(better, z, best_z);
    }
    return {best_s, best_z};
  }

  at::Tensor quantize(const at::Tensor& w, const at::Tensor& s, const at::Tensor& z) const {
    return at::clamp(at::round(w / s) + z, double(spec_.qmin()), double(spec_.qmax()));
  }

  /// Stores the result: W [N, K] on `grid`, mapped back to the weight's orientation, as its
  /// integers (a quarter of the float weight's memory at 8 bits and less: a large model's
  /// solved layers are all held until export).
  void store(const at::Tensor& dequantized, const Grid& grid, std::int64_t axis) {
    if (spec_.group_size > 0) {
      params_.scale = (axis == 0 ? grid.scale.t() : grid.scale).contiguous();
      params_.zero_point = (axis == 0 ? grid.zero_point.t() : grid.zero_point).contiguous().to(at::kInt);
    } else {  // one column: per channel, or the same value in every row (per tensor)
      const at::Tensor s = grid.scale.select(1, 0), z = grid.zero_point.select(1, 0).to(at::kInt);
      params_.scale = spec_.per_channel ? s.contiguous() : s[0].clone();
      params_.zero_point = spec_.per_channel ? z.contiguous() : z[0].clone();
    }
    const bool fits_int8 = spec_.qmin() >= -128 && spec_.qmax() <= 127;
    codes_ = quantize_to_int((axis == 0 ? dequantized.t() : dequantized).contiguous(), params_, spec_)
                 .to(fits_int8 ? at::kChar : at::kShort);
  }

  /// H with dead inputs (never non-zero) made harmless, as the reference does. Takes the
  /// accumulated Hessian (solving is its last use): a K x K matrix is the largest thing a layer
  /// holds, so copies of it count.
  at::Tensor prepared_hessian(at::Tensor& w) {
    if (!hessian_.defined()) throw Error(where_ + ": " + name_ + " solved without layer inputs");
    at::Tensor h = std::move(hessian_);
    hessian_ = at::Tensor();
    const at::Tensor dead = h.diagonal() == 0;
    h.diagonal().masked_fill_(dead, 1.0);
    w.masked_fill_(dead.unsqueeze(0), 0.0);
    return h;
  }

  QSpec spec_;
  std::string where_;
  const char* name_;
  QParams params_;
  at::Tensor codes_;  // the solved weight's integers on params_
  at::Tensor hessian_;
  std::int64_t samples_ = 0;
};

class GptqQuantizer : public WeightRounding {
 public:
  explicit GptqQuantizer(const QuantizerContext& c) : WeightRounding(c, "gptq") {
    damp_ = c.options.get_double("damp", 0.01);
    block_ = c.options.get_int("block_size", 128);
    act_order_ = c.options.get_bool("act_order", false);
    clip_search_ = c.options.get_bool("clip_search", true);
    clip_ = clip_search_options(c.options);
    if (!(damp_ > 0)) throw Error(c.options.where() + ": damp must be > 0");
    if (block_ < 1) throw Error(c.options.where() + ": block_size must be >= 1");
  }

  void solve(const at::Tensor& weight, std::int64_t axis) {
    if (weight.dim() != 2) throw Error(where_ + ": gptq needs a 2-D weight, got " + c10::str(weight.sizes()));
    at::Tensor w = to_rows(weight.detach(), axis).to(at::kFloat).clone();
    const std::int64_t n = w.size(0), k = w.size(1);
    at::Tensor h = prepared_hessian(w);
    Grid grid = observed_grid(w, axis, n, k);
    const bool groups = spec_.group_size > 0;
    const std::int64_t g = grid.group;
    const bool dynamic_groups = groups && !act_order_;
    if (!dynamic_groups) {
      // Parameters fixed before any column moves: per channel, per tensor, or static groups
      // (act_order: from the original weight, before the order changes).
      for (std::int64_t c = 0; c < k; c += g) {
        const std::int64_t len = std::min(g, k - c);
        const at::Tensor cols = w.narrow(1, c, len);
        at::Tensor s, z;
        if (clip_search_)
          std::tie(s, z) = searched_params(cols, h.narrow(0, c, len).narrow(1, c, len), clip_,
                                           spec_.per_channel || groups ? nullptr : &w);
        else if (groups) std::tie(s, z) = group_params(cols);
        else continue;  // the observer's parameters
        grid.scale.select(1, c / g).copy_(s);
        grid.zero_point.select(1, c / g).copy_(z);
      }
    }
    // Dynamic groups search their range when the algorithm reaches them, on their updated
    // columns, against their block of H (kept here: the factorization consumes H).
    std::vector<at::Tensor> group_blocks;
    if (dynamic_groups && clip_search_)
      for (std::int64_t c = 0; c < k; c += g) {
        const std::int64_t len = std::min(g, k - c);
        group_blocks.push_back(h.narrow(0, c, len).narrow(1, c, len).clone());
      }
    at::Tensor perm;
    if (act_order_) {
      perm = std::get<1>(h.diagonal().sort(/*stable=*/true, 0, /*descending=*/true));
      w = w.index_select(1, perm);
      h = h.index_select(0, perm).index_select(1, perm);
    }
    const at::Tensor u = inverse_factor(std::move(h));
    std::vector<std::int64_t> original;  // act_order: the original column of each position
    if (act_order_) {
      const at::Tensor p = perm.to(at::kCPU).contiguous();
      original.assign(p.data_ptr<std::int64_t>(), p.data_ptr<std::int64_t>() + k);
    }
    // Blocks never cut a group, so a group's parameters come from its fully updated columns.
    const std::int64_t block = groups ? std::max<std::int64_t>(1, block_ / g) * g : block_;
    at::Tensor q = at::empty_like(w);
    for (std::int64_t b0 = 0; b0 < k; b0 += block) {
      const std::int64_t len = std::min(block, k - b0);
      at::Tensor w1 = w.narrow(1, b0, len).clone();
      at::Tensor err = at::empty({n, len}, w.options());
      const at::Tensor u1 = u.narrow(0, b0, len).narrow(1, b0, len);
      at::Tensor s, z;
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t col = b0 + i;
        if (!dynamic_groups) {
          const std::int64_t group = groups ? original[static_cast<std::size_t>(col)] / g : 0;
          s = grid.scale.select(1, group);
          z = grid.zero_point.select(1, group);
        } else if (col % g == 0) {
          const at::Tensor cols = w1.narrow(1, i, std::min(g, len - i));
          std::tie(s, z) = clip_search_ ? searched_params(cols, group_blocks[static_cast<std::size_t>(col / g)], clip_)
                                        : group_params(cols);
          grid.scale.select(1, col / g).copy_(s);
          grid.zero_point.select(1, col / g).copy_(z);
        }
        const at::Tensor x = w1.select(1, i);
        const at::Tensor qi = quantize(x, s, z);
        const at::Tensor dq = (qi - z) * s;
        q.select(1, col).copy_(dq);
        const at::Tensor e = (x - dq) / u1[i][i];
        if (i + 1 < len) w1.narrow(1, i + 1, len - i - 1).sub_(at::outer(e, u1[i].narrow(0, i + 1, len - i - 1)));
        err.select(1, i).copy_(e);
      }
      if (b0 + len < k)
        w.narrow(1, b0 + len, k - b0 - len).sub_(err.mm(u.narrow(0, b0, len).narrow(1, b0 + len, k - b0 - len)));
    }
    if (act_order_) q = q.index_select(1, at::argsort(perm));
    store(q, grid, axis);
    hessian_ = at::Tensor();
  }

 private:
  /// The upper Cholesky factor of H^-1 after damping; more damping where H is too ill-conditioned.
  /// Damps H in place (its diagonal is kept to retry): three K x K matrices at most, not five.
  at::Tensor inverse_factor(at::Tensor h) const {
    const double mean = h.diagonal().mean().item<double>();
    const at::Tensor diagonal = h.diagonal().clone();
    double damp = damp_;
    for (int attempt = 0; attempt < 4; ++attempt, damp *= 10) {
      h.diagonal().copy_(diagonal).add_(damp * mean);
      auto [l, info] = at::linalg_cholesky_ex(h);
      if (info.item<std::int64_t>() != 0) continue;
      at::Tensor inverse = at::cholesky_inverse(l);
      l = at::Tensor();
      auto [u, info2] = at::linalg_cholesky_ex(inverse, /*upper=*/true);
      if (info2.item<std::int64_t>() != 0) continue;
      if (damp != damp_)
        sdk::log_warn(where_ + ": gptq: the layer's input Hessian needed damp = " + std::to_string(damp) +
                      " (option damp = " + std::to_string(damp_) + ") to be positive definite");
      return u;
    }
    throw Error(where_ + ": gptq: the layer's input Hessian is not positive definite even with damp = " +
                std::to_string(damp / 10) + "; calibrate on more (or more varied) samples");
  }

  double damp_;
  std::int64_t block_;
  bool act_order_;
  bool clip_search_;
  ClipSearch clip_;
};

class RtnQuantizer : public WeightRounding {
 public:
  explicit RtnQuantizer(const QuantizerContext& c) : WeightRounding(c, "rtn") {
    clip_ = clip_search_options(c.options);
  }

  void solve(const at::Tensor& weight, std::int64_t axis) {
    if (weight.dim() != 2)
      throw Error(where_ + ": rtn's clip search needs a 2-D weight, got " + c10::str(weight.sizes()));
    at::Tensor w = to_rows(weight.detach(), axis).to(at::kFloat).clone();
    const std::int64_t n = w.size(0), k = w.size(1);
    const at::Tensor h = prepared_hessian(w);
    Grid grid = observed_grid(w, axis, n, k);
    const std::int64_t g = grid.group;
    const bool per_tensor = !spec_.per_channel;
    at::Tensor q = at::empty_like(w);
    for (std::int64_t c = 0; c < k; c += g) {
      const std::int64_t len = std::min(g, k - c);
      const at::Tensor cols = w.narrow(1, c, len), hg = h.narrow(0, c, len).narrow(1, c, len);
      auto [best_s, best_z] = searched_params(cols, hg, clip_, per_tensor ? &w : nullptr);
      q.narrow(1, c, len).copy_((quantize(cols, best_s.unsqueeze(1), best_z.unsqueeze(1)) - best_z.unsqueeze(1)) *
                                best_s.unsqueeze(1));
      grid.scale.select(1, c / g).copy_(best_s);
      grid.zero_point.select(1, c / g).copy_(best_z);
    }
    store(q, grid, axis);
    hessian_ = at::Tensor();
  }

 private:
  ClipSearch clip_;
};

/// A rounding with its roles (Note [Capabilities]): solved from the layer's inputs, which add
/// up over processes.
template <class Rounding>
class Solved final : public Rounding, public SolvedFromInputs, public MergesInputs {
 public:
  using Rounding::Rounding;
  void accumulate_inputs(const at::Tensor& rows) override { Rounding::accumulate_inputs(rows); }
  void solve(const at::Tensor& weight, std::int64_t axis) override { Rounding::solve(weight, axis); }
  std::vector<at::Tensor> input_state() const override { return Rounding::input_state(); }
  void merge_inputs(const std::vector<at::Tensor>& sums) override { Rounding::merge_inputs(sums); }
};

void register_all(Registrar& r) {
  r.add_quantizer<Solved<GptqQuantizer>>("gptq");
  // Without a clip search rtn rounds the observer's grid to nearest: nothing to solve.
  r.add_quantizer_factory("rtn", [](const QuantizerContext& c) -> std::unique_ptr<Quantizer> {
    if (c.options.get_bool("clip_search", false)) return std::make_unique<Solved<RtnQuantizer>>(c);
    return std::make_unique<RtnQuantizer>(c);
  });
}

}  // namespace
}  // namespace sparsebit::quantizers

SPARSEBIT_PLUGIN("sparsebit.quantizers.weight_rounding", SPARSEBIT_PLUGIN_VERSION, sparsebit::quantizers::register_all)
