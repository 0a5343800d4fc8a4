// awq (simplify stage, off by default): activation-aware weight scaling for low-bit weights
// (Lin et al., "AWQ", MLSys 2024). A few input channels of a layer carry much larger activations
// than the rest; the weights they multiply matter most, and rounding them to a coarse grid costs
// the most output error. For each activation X read by MatMul / Gemm layers with constant
// weights, the pass multiplies the weight rows of input channel j by
//     s_j = mean|X_j|^alpha   (normalised so that sqrt(max s * min s) = 1)
// and divides channel j of X by s_j, so X W is unchanged in float while the salient rows get a
// finer share of their group's grid. alpha is searched over 0, 1/grid, ..., (grid-1)/grid per X
// (readers of one X share s) for the least output error of the rounded weights,
//     sum over readers of  trace(E^T G E),  E = round(diag(s) W) / s - W,  G = E[x x^T],
// where round is the weight's configured grid (PassContext::weight_grid) and G the Gram matrix
// of X on the calibration data (PassContext::channel_moments). This is the layer's output mean
// squared error computed exactly from second moments, so no activations are kept; alpha = 0 is
// plain rounding, so the chosen s is never worse than it on this measure. 1/s folds into X's
// producer where the graph allows (LayerNormalization, RMSNorm's Mul by gamma, a MatMul / Gemm
// whose output X is, one factor of a gated product; channel_scaling.h), otherwise a Mul goes in
// front of the readers.
//
// With `clip_search` (on by default, as in the paper) each weight group of each output channel is
// clipped to the fraction of its range, among 1, 1 - (1 - max_shrink)/clip_grid, ...,
// max_shrink, that gives the least output error of that group, (w - q)^T G_gg (w - q) with the
// Gram block of the group's input channels; each alpha is judged by its clipped weights (ranked
// on a quarter of the clip grid, the best clipped on all of it: search_scales). Clipping
// changes the float weights, so the float function is kept only with clip_search = false.
//
// The weights are then quantized by the [w] quantizer (rtn, gptq, ...) as without the pass.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "channel_scaling.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

/// A reader of X, with its weight as [K, N] (K along X's channels) and its grid if quantized.
struct Reader {
  ScaledReader reader;
  std::optional<PassContext::WeightGrid> grid;
};

/// The weight of `r` laid out [K, N], float32, on `device` (where the statistics are).
at::Tensor weight_kn(const Graph& g, const ScaledReader& r, const at::Device& device) {
  const at::Tensor& w = g.initializers.at(r.node->inputs[1]);
  return (r.weight_axis == 0 ? w : w.t()).to(device, at::kFloat);
}

/// Rounds a [K, N] candidate with the reader's grid (which takes the weight's own layout).
at::Tensor round_kn(const Reader& r, const at::Tensor& wkn) {
  if (r.reader.weight_axis == 0) return r.grid->round(wkn.contiguous());
  return r.grid->round(wkn.t().contiguous()).t();
}

/// a b for a batch of products [B, M, K] x [B, K, N], the batch split over ATen's threads on the
/// CPU: with one BLAS thread (Note [One thread pool]) a single at::bmm runs on one core.
at::Tensor threaded_bmm(const at::Tensor& a, const at::Tensor& b) {
  if (!a.is_cpu() || a.size(0) < 2 || at::get_num_threads() < 2) return at::bmm(a, b);
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  at::parallel_for(0, a.size(0), 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) {
      at::Tensor slice = out[i];
      at::mm_out(slice, a[i], b[i]);
    }
  });
  return out;
}

/// a b for [M, K] x [K, N], rows of a split over ATen's threads on the CPU (as threaded_bmm).
at::Tensor threaded_mm(const at::Tensor& a, const at::Tensor& b) {
  const std::int64_t m = a.size(0), threads = at::get_num_threads();
  if (!a.is_cpu() || threads < 2 || m < 2 * threads) return at::mm(a, b);
  const std::int64_t rows = (m + threads - 1) / threads;
  return threaded_bmm(at::constant_pad_nd(a, {0, 0, 0, rows * threads - m}).reshape({threads, rows, a.size(1)}),
                      b.unsqueeze(0).expand({threads, b.size(0), b.size(1)}))
      .view({rows * threads, b.size(1)})
      .slice(0, 0, m);
}

/// sum_n e_n^T G e_n for E [K, N].
double output_error(const at::Tensor& gram, const at::Tensor& e) {
  return (threaded_mm(gram, e) * e).sum().item<double>();
}

/// Group boundaries along K of a reader's grid: per-group schemes cut K into group_size rows
/// (the last may be short); per-channel and per-tensor ones are one group over all of K.
std::vector<std::pair<std::int64_t, std::int64_t>> k_groups(const Reader& r, std::int64_t k) {
  const std::int64_t size = r.grid->spec.group_size > 0 ? r.grid->spec.group_size : k;
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t b = 0; b < k; b += size) out.emplace_back(b, std::min(k, b + size));
  return out;
}

/// Clips each (group, output channel) of `w` [K, N] to the fraction of its range with the least
/// output error under `gram`; returns the clipped weight, and in `group_error` the sum of those
/// least errors: the output error without the products between groups' errors. The groups are
/// handled as one batch [groups, group size, N] (a short last group padded with zero rows, which
/// add no error), so a step costs the same few ops however many groups there are.
at::Tensor clip_search(const Reader& r, const at::Tensor& w, const at::Tensor& gram, int steps, double max_shrink,
                       double& group_error) {
  const auto groups = k_groups(r, w.size(0));
  const std::int64_t k = w.size(0), n = w.size(1), count = static_cast<std::int64_t>(groups.size());
  const std::int64_t size = groups[0].second - groups[0].first, padded = count * size;
  auto batched = [&](const at::Tensor& kn) {  // [K, N] -> [groups, size, N]
    return (padded == k ? kn : at::constant_pad_nd(kn, {0, 0, 0, padded - k})).view({count, size, n});
  };
  std::vector<at::Tensor> blocks;  // the Gram blocks of each group's input channels
  for (const auto& [b, e] : groups) {
    const at::Tensor block = gram.slice(0, b, e).slice(1, b, e);
    blocks.push_back(e - b == size ? block : at::constant_pad_nd(block, {0, size - (e - b), 0, size - (e - b)}));
  }
  const at::Tensor gram_blocks = at::stack(blocks);
  const at::Tensor w3 = batched(w);
  // Ranges include zero, as observers make them: clipping never lifts a group's small values.
  at::Tensor hi = w3.amax(1, true).clamp_min(0), lo = w3.amin(1, true).clamp_max(0);
  if (r.grid->spec.symmetric) {
    hi = at::maximum(hi, -lo);
    lo = -hi;
  }
  at::Tensor best_err = at::full({count, n}, std::numeric_limits<float>::infinity(), w.options());
  at::Tensor best_f = at::ones({count, 1, n}, w.options());
  for (int step = 0; step <= steps; ++step) {
    const double f = 1.0 - (1.0 - max_shrink) * step / steps;
    const at::Tensor clipped = at::clamp(w3, lo * f, hi * f).view({padded, n}).slice(0, 0, k);
    const at::Tensor e3 = batched(round_kn(r, clipped) - w);
    const at::Tensor per_n = (threaded_bmm(gram_blocks, e3) * e3).sum(1);  // [groups, N]
    const at::Tensor better = per_n < best_err;
    best_err = at::where(better, per_n, best_err);
    best_f = at::where(better.unsqueeze(1), at::full({}, f, w.options()), best_f);
  }
  group_error = best_err.sum().item<double>();
  return at::clamp(w3, lo * best_f, hi * best_f).view({padded, n}).slice(0, 0, k).contiguous();
}

/// Alphas clipped on the whole clip grid after the ranking (besides alpha 0).
constexpr std::size_t kFinalists = 2;

/// How each candidate's weights are clipped before their error counts (clip_search).
struct ClipOptions {
  bool on = true;
  int steps = 20;
  double max_shrink = 0.5;
};

/// The scales searched for one X: s (a 1-D double tensor), whether it differs from 1, and each
/// quantized reader's weight [K, N] as it is to be stored (scaled, and clipped with clip_search;
/// undefined for readers left float), all on the host.
struct Scaling {
  at::Tensor s;
  bool scaled = false;
  std::vector<at::Tensor> weights;
};

/// The s of the alpha with the least output error over the quantized readers. Without
/// clip_search every alpha is judged by that error. With it, each alpha is judged after its own
/// clipping (scaling first and clipping after can pick an s whose best clipping is worse than
/// that of plain weights): all are ranked after a quarter of the clip grid by the clip search's
/// own error within groups (the Gram matrix's diagonal blocks, K g N multiply-adds where the
/// whole error costs K^2 N), and the best kFinalists and alpha 0 (clipping alone, so the result
/// is never worse than it) are clipped on the whole grid and judged by the whole output error.
/// (Ranked unclipped, with four finalists, the search took 0.6x as long and moved a trained
/// nanoGPT-layout decoder's predictions further from float's in five settings of six.)
Scaling search_scales(const Graph& g, const std::vector<Reader>& readers, const PassContext::ChannelMoments& m,
                      std::int64_t grid, const ClipOptions& clip) {
  const at::Tensor mean = m.mean_abs.to(at::kDouble);
  std::vector<at::Tensor> weights;
  for (const auto& r : readers) weights.push_back(r.grid ? weight_kn(g, r.reader, m.gram.device()) : at::Tensor());
  auto scales = [&](std::int64_t i) {
    const double alpha = static_cast<double>(i) / static_cast<double>(grid);
    // Channels never active keep s = 1: scaling them is free in float but would move their
    // weights off the grid for nothing.
    at::Tensor s = at::where(mean > 0, mean.pow(alpha), at::ones_like(mean)).clamp_min(1e-4);
    return s / std::sqrt(s.max().item<double>() * s.min().item<double>());
  };
  // The output error of alpha i's scales, its weights clipped in `steps` steps (0: not clipped);
  // with `within_groups` the clip search's error within groups only.
  auto judge = [&](std::int64_t i, int steps, bool within_groups, std::vector<at::Tensor>& stored) {
    const at::Tensor s = scales(i), sf = s.to(at::kFloat).unsqueeze(1);
    const at::Tensor scaled_gram = steps > 0 ? m.gram / at::outer(s, s).to(at::kFloat) : at::Tensor();  // of X / s
    double err = 0;
    stored.assign(readers.size(), at::Tensor());
    for (std::size_t k = 0; k < readers.size(); ++k) {
      if (!weights[k].defined()) continue;
      stored[k] = weights[k] * sf;
      double group_error = 0;
      if (steps > 0) stored[k] = clip_search(readers[k], stored[k], scaled_gram, steps, clip.max_shrink, group_error);
      err += steps > 0 && within_groups ? group_error
                                        : output_error(m.gram, round_kn(readers[k], stored[k]) / sf - weights[k]);
    }
    if (!std::isfinite(err))
      throw Error("the output error is not finite (alpha " + std::to_string(static_cast<double>(i) / grid) + ")");
    return err;
  };
  std::vector<std::pair<double, std::int64_t>> ranked;
  Scaling result;
  std::vector<at::Tensor> stored;
  auto on_host = [](Scaling s) {
    s.s = s.s.cpu();
    for (auto& w : s.weights)
      if (w.defined()) w = w.cpu();
    return s;
  };
  const int ranking_steps = clip.on ? std::max(1, clip.steps / 4) : 0;
  for (std::int64_t i = 0; i < grid; ++i) {
    ranked.emplace_back(judge(i, ranking_steps, clip.on, stored), i);
    if (ranked.back() <= *std::min_element(ranked.begin(), ranked.end())) result = {scales(i), i != 0, stored};
  }
  if (!clip.on) return on_host(std::move(result));
  std::sort(ranked.begin(), ranked.end());
  std::set<std::int64_t> finalists = {0};
  for (std::size_t r = 0; r < ranked.size() && r < kFinalists; ++r) finalists.insert(ranked[r].second);
  double best = std::numeric_limits<double>::infinity();
  for (std::int64_t i : finalists) {
    const double err = judge(i, clip.steps, false, stored);
    if (err < best) best = err, result = {scales(i), i != 0, stored};
  }
  return on_host(std::move(result));
}

/// Replaces constant input 1 of `n` with `value` given [K, N], laid out as the reader's weight,
/// under a fresh name (the old one may be shared).
void set_weight(Graph& g, const ScaledReader& r, const at::Tensor& value) {
  const at::ScalarType type = g.initializers.at(r.node->inputs[1]).scalar_type();
  replace_constant(g, *r.node, 1, (r.weight_axis == 0 ? value : value.t()).to(type).contiguous(), "_clipped");
}

class Awq final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }

  bool run(Graph& g, const PassContext& ctx) override {
    const std::int64_t grid = ctx.options.get_int("grid", 20);
    if (grid < 1 || grid > 1000) throw Error("option grid must be between 1 and 1000, got " + std::to_string(grid));
    const bool clip = ctx.options.get_bool("clip_search", true);
    const std::int64_t clip_grid = ctx.options.get_int("clip_grid", 20);
    if (clip_grid < 1 || clip_grid > 1000)
      throw Error("option clip_grid must be between 1 and 1000, got " + std::to_string(clip_grid));
    const double max_shrink = ctx.options.get_double("max_shrink", 0.5);
    if (!(max_shrink > 0 && max_shrink < 1))
      throw Error("option max_shrink must be in (0, 1), got " + std::to_string(max_shrink));
    const std::int64_t budget_mb = ctx.options.get_int("max_gram_mb", 1024);
    if (budget_mb < 1) throw Error("option max_gram_mb must be positive");
    if (!ctx.weight_grid)
      throw Error("needs the weight grids of a quantization config: run it within quantize, qat or prune");

    // X -> its MatMul / Gemm readers, in graph order; X read along another axis too is left.
    std::map<std::string, std::vector<Reader>> groups;
    std::vector<std::string> order;
    for (Node* n : g.nodes()) {
      auto s = scalable_reader(g, *n, false, false);
      if (!s) continue;
      const std::int64_t out_axis = 1 - s->second.weight_axis;
      auto& readers = groups[n->inputs[0]];
      if (readers.empty()) order.push_back(n->inputs[0]);
      readers.push_back({s->second, ctx.weight_grid(*n, 1, out_axis)});
    }
    std::vector<std::string> values;
    for (const auto& x : order) {
      const auto& readers = groups.at(x);
      const bool any_quantized = std::any_of(readers.begin(), readers.end(), [](const Reader& r) { return r.grid; });
      const std::int64_t k = g.initializers.at(readers[0].reader.node->inputs[1]).size(readers[0].reader.weight_axis);
      const bool same_k = std::all_of(readers.begin(), readers.end(), [&](const Reader& r) {
        return g.initializers.at(r.reader.node->inputs[1]).size(r.reader.weight_axis) == k;
      });
      if (any_quantized && same_k) values.push_back(x);
    }
    if (values.empty()) return false;
    if (!ctx.channel_moments)
      throw Error("needs calibration data for the activation statistics: run it within quantize, qat or prune");

    bool changed = false;
    std::size_t scaled = 0, folded = 0, clipped = 0;
    // Gram matrices are C x C floats: ask for as many values per pass over the data as fit.
    for (std::size_t first = 0; first < values.size();) {
      std::vector<PassContext::ChannelRequest> requests;
      std::int64_t bytes = 0;
      std::size_t last = first;
      for (; last < values.size(); ++last) {
        const auto& r = groups.at(values[last])[0].reader;
        const std::int64_t c = g.initializers.at(r.node->inputs[1]).size(r.weight_axis);
        if (!requests.empty() && bytes + c * c * 4 > budget_mb << 20) break;
        bytes += c * c * 4;
        requests.push_back({values[last], -1});
      }
      auto moments = ctx.channel_moments(requests);
      for (std::size_t i = first; i < last; ++i) {
        const PassContext::ChannelMoments m = std::move(moments.at(i - first));  // freed after its value
        if (!m.gram.defined() || m.rows == 0) continue;
        auto& readers = groups.at(values[i]);
        const Scaling best = search_scales(g, readers, m, grid, {clip, static_cast<int>(clip_grid), max_shrink});
        std::vector<ScaledReader> plain;
        for (const auto& r : readers) plain.push_back(r.reader);
        if (best.scaled) {
          folded += scale_channels(g, values[i], -1, plain, best.s, "awq") ? 1 : 0;
          ++scaled;
          changed = true;
        }
        for (std::size_t k = 0; clip && k < readers.size(); ++k) {
          if (!readers[k].grid) continue;
          const at::Tensor w = weight_kn(g, readers[k].reader, at::kCPU);  // as scale_channels left it
          if (at::equal(best.weights[k], w)) continue;
          set_weight(g, readers[k].reader, best.weights[k]);
          ++clipped;
          changed = true;
        }
        // Done with these weights: the host may give their memory back (a large model's layers
        // are then held one at a time, not the originals and the results of all of them).
        for (const auto& r : readers) release_initializer(g, r.reader.node->inputs[1]);
      }
      first = last;
    }
    sdk::log_info("awq: " + std::to_string(scaled) + " of " + std::to_string(values.size()) + " activations scaled (" +
                  std::to_string(folded) + " folded into their producer, " + std::to_string(scaled - folded) +
                  " through an inserted Mul), " + std::to_string(clipped) + " weights clipped");
    return changed;
  }
};

void register_all(Registrar& r) { r.add_pass<Awq>("awq", PassSchedule{1600, false}); }

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.awq", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
