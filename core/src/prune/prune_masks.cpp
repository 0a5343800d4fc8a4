// Element and N:M sparsity masks, and bias compensation (Note [Bias compensation]) for every
// kind of pruning.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "base/glob.h"
#include "prune/prune_internal.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit::prune_detail {
namespace {

/// Weights (constant kWeight inputs, rank >= 2) by node, with their output-channel axis.
struct WeightRef {
  std::size_t node, input;
  std::string name;
  std::int64_t channel_axis;
};

std::vector<WeightRef> weights_of(const Graph& g, const Executor& ex) {
  std::vector<WeightRef> out;
  for (std::size_t i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    const auto specs = ex.modules()[i].module->input_specs();
    for (std::size_t k = 0; k < specs.size() && k < n.inputs.size(); ++k) {
      if (specs[k].role != InputRole::kWeight || !n.has_input(k)) continue;
      auto it = g.initializers.find(n.inputs[k]);
      if (it == g.initializers.end() || !it->second.is_floating_point() || it->second.dim() < 2) continue;
      out.push_back({i, k, n.inputs[k], specs[k].channel_axis});
    }
  }
  return out;
}

/// Keeps the N highest scores of every M consecutive ones along `input_axis`.
at::Tensor nm_mask(const at::Tensor& scores, std::int64_t input_axis, std::int64_t n, std::int64_t m) {
  at::Tensor s = scores.movedim(input_axis, -1).contiguous();
  const auto moved = s.sizes().vec();
  at::Tensor groups = s.reshape({-1, m});
  at::Tensor keep = at::zeros_like(groups, groups.options().dtype(at::kFloat));
  keep.scatter_(1, std::get<1>(groups.topk(n, 1)), 1.0);
  return keep.reshape(moved).movedim(-1, input_axis).contiguous();
}

/// For a 2-D Conv, the sum over the batch of the mean over output positions of the input under
/// each kernel tap, zero padding included: [C, kh * kw]. What a removed weight w[o, c, tap] took
/// away from output o on average is w times that mean, exactly, also near the borders.
/// Undefined for other convs (auto_pad SAME, 1-D, 3-D): they use the channel mean.
at::Tensor conv_tap_sums(const Node& n, const at::Tensor& x) {
  if (n.op_type != "Conv" || x.dim() != 4 || n.attr_string("auto_pad", "NOTSET") != "NOTSET") return {};
  auto kernel = n.attr_ints("kernel_shape");
  if (kernel.size() != 2) return {};
  auto pads = n.attr_ints("pads", {0, 0, 0, 0});
  auto strides = n.attr_ints("strides", {1, 1}), dilations = n.attr_ints("dilations", {1, 1});
  if (pads.size() != 4 || strides.size() != 2 || dilations.size() != 2) return {};
  const at::Tensor padded = at::constant_pad_nd(x.to(at::kDouble), {pads[1], pads[3], pads[0], pads[2]});
  const at::Tensor cols = at::im2col(padded, kernel, dilations, {0, 0}, strides);  // [N, C * taps, L]
  return cols.mean(2).sum(0).view({x.size(1), kernel[0] * kernel[1]});
}

}  // namespace

/// Per-position mean of input 0 of every node in `axis_of` (along that axis) over `data`.
std::map<std::size_t, at::Tensor> input_means(const Graph& g, const Registry& registry, Dataset& data,
                                              const Config& config,
                                              const std::map<std::size_t, std::int64_t>& axis_of) {
  Executor ex(g, registry);
  Batcher batcher(data, g.inputs, config.calibration.batch_size, config.calibration.count);
  std::map<std::size_t, at::Tensor> sums;
  std::map<std::size_t, double> counts;
  c10::InferenceMode guard;
  while (auto b = batcher.next()) {
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t i = 0; i < g.inputs.size(); ++i) feeds[g.inputs[i].name] = b->inputs[i];
    ex.run(feeds, [&](std::size_t node, std::size_t input, const at::Tensor& v) {
      auto it = axis_of.find(node);
      if (input != 0 || it == axis_of.end() || !v.defined() || !v.is_floating_point() || v.dim() == 0) return v;
      const std::int64_t a = it->second < 0 ? it->second + v.dim() : it->second;
      auto& acc = sums[node];
      if (at::Tensor taps = conv_tap_sums(g.node(node), v); taps.defined()) {
        acc = acc.defined() ? acc + taps : taps;
        counts[node] += double(v.size(0));
        return v;
      }
      std::vector<std::int64_t> dims;
      for (std::int64_t d = 0; d < v.dim(); ++d)
        if (d != a) dims.push_back(d);
      at::Tensor sum = dims.empty() ? v.to(at::kDouble) : v.to(at::kDouble).sum(dims);
      acc = acc.defined() ? acc + sum : sum;
      counts[node] += double(v.numel() / std::max<std::int64_t>(1, v.size(a)));
      return v;
    });
  }
  std::map<std::size_t, at::Tensor> means;
  for (auto& [node, sum] : sums) means[node] = sum / counts[node];
  return means;
}

/// How much node `n`'s output moves on average when its weight changes from `w` to `w_new`,
/// given the mean `mu` of its input per input channel (or feature): what its bias must gain to
/// keep that mean. Undefined where it cannot be expressed as a bias (MatMul, transposed A).
at::Tensor bias_shift(const Node& n, const at::Tensor& w, const at::Tensor& w_new, const at::Tensor& mu) {
  const at::Tensor d = (w - w_new).to(at::kDouble);
  if (n.op_type == "Conv") {
    const std::int64_t groups = n.attr_int("group", 1), out = d.size(0), per_group = d.size(1);
    if (mu.size(0) != groups * per_group || out % groups) return {};
    const std::int64_t taps = d.numel() / (out * per_group);
    if (mu.dim() == 2 && mu.size(1) == taps && mu.size(0) == groups * per_group) {  // per-tap means
      const at::Tensor m = mu.view({groups, per_group * taps}).repeat_interleave(out / groups, 0);
      return (d.reshape({out, per_group * taps}) * m).sum(1);
    }
    if (mu.dim() != 1) return {};
    const at::Tensor m = mu.view({groups, per_group}).repeat_interleave(out / groups, 0);
    return (d.flatten(2).sum(2) * m).sum(1);
  }
  if (n.op_type == "Gemm" && n.attr_int("transA", 0) == 0) {
    const double beta = n.attr_float("beta", 1.0), alpha = n.attr_float("alpha", 1.0);
    const at::Tensor dw = n.attr_int("transB", 0) ? d : d.t();
    if (beta == 0 || mu.numel() != dw.size(1)) return {};
    return dw.matmul(mu) * (alpha / beta);
  }
  return {};
}

/// Adds `delta` (one value per output channel) to node `node`'s bias, creating it if absent.
void add_to_bias(Graph& g, std::size_t node, const at::Tensor& delta, const std::map<std::string, int>& readers) {
  Node& n = g.node(node);
  const at::Tensor w = g.initializers.at(n.inputs[1]);
  if (!n.has_input(2)) {
    const std::string name = g.unique_name(n.name + "_bias");
    g.initializers[name] = delta.to(w.scalar_type());
    n.inputs.resize(3);
    n.inputs[2] = name;
    return;
  }
  const at::Tensor b = g.initializers.at(n.inputs[2]);
  set_input_constant(g, node, 2, (b + delta.to(b.scalar_type())).contiguous(), readers);
}

void prune_elements(const Model& model, const Config& config, Sparser& sparser, const Registry& registry, Dataset* data,
                    PruneResult& r) {
  const SparseConfig& cfg = *config.sparse;
  const std::string& sparser_name = cfg.sparser;
  const Graph& g = model.graph;
  Executor ex(g, registry);
  Graph pruned = g.clone();
  std::set<std::string> done;
  struct Target {
    WeightRef ref;
    at::Tensor scores;
    double ratio;
  };
  std::vector<Target> targets;
  for (const auto& ref : weights_of(g, ex)) {
    const Node& n = g.node(ref.node);
    if (!done.insert(ref.name).second) continue;
    if (matches_any(n.name, cfg.skip)) continue;
    const double ratio = ratio_for(cfg, n.name);
    if (r.pattern == SparsityPattern::kElement && ratio <= 0) continue;
    const at::Tensor& w = g.initializers.at(ref.name);
    if (r.pattern == SparsityPattern::kNM) {
      const std::int64_t axis = ref.channel_axis < 0 ? ref.channel_axis + w.dim() : ref.channel_axis;
      const std::int64_t input_axis = axis == 0 ? 1 : 0;
      if (w.size(input_axis) % r.m != 0) {
        r.notes.push_back(n.describe() + ": " + std::to_string(w.size(input_axis)) +
                          " input channels are not a multiple of " + std::to_string(r.m) + "; left dense");
        continue;
      }
    }
    targets.push_back({ref, checked_scores(sparser, sparser_name, w, ref.channel_axis, n, r.pattern), ratio});
  }
  std::optional<double> global_threshold;
  std::int64_t global_ties = 0;  // how many scores equal to the threshold still go
  if (r.pattern == SparsityPattern::kElement && cfg.scope == "global" && !targets.empty()) {
    std::vector<at::Tensor> all;
    for (const auto& t : targets) all.push_back(t.scores.flatten());
    at::Tensor flat = at::cat(all);
    const auto k = static_cast<std::int64_t>(std::floor(cfg.ratio * double(flat.numel())));
    if (k > 0) {
      const double th = std::get<0>(flat.kthvalue(k)).item<double>();
      global_threshold = th;
      global_ties = k - (flat < th).sum().item<std::int64_t>();
    }
  }
  std::map<std::size_t, at::Tensor> means;
  if (data) {  // Note [Bias compensation]
    std::map<std::size_t, std::int64_t> axis_of;
    for (const auto& t : targets)
      if (t.ref.input == 1) axis_of[t.ref.node] = 1;
    means = input_means(g, registry, *data, config, axis_of);
  }
  const auto readers = initializer_readers(g);
  for (auto& t : targets) {
    const at::Tensor& w = g.initializers.at(t.ref.name);
    const Node& n = g.node(t.ref.node);
    at::Tensor mask;
    if (r.pattern == SparsityPattern::kNM) {
      const std::int64_t axis = t.ref.channel_axis < 0 ? t.ref.channel_axis + w.dim() : t.ref.channel_axis;
      mask = nm_mask(t.scores, axis == 0 ? 1 : 0, r.n, r.m);
    } else if (global_threshold) {
      at::Tensor below = t.scores < *global_threshold;
      at::Tensor tie = (t.scores == *global_threshold).flatten();
      const std::int64_t ties_here = std::min(global_ties, tie.sum().item<std::int64_t>());
      if (ties_here > 0) {
        at::Tensor idx = tie.nonzero().flatten().slice(0, 0, ties_here);
        at::Tensor extra = at::zeros({tie.numel()}, at::kBool).index_fill_(0, idx, true).view(t.scores.sizes());
        below = below | extra;
        global_ties -= ties_here;
      }
      mask = (~below).to(at::kFloat);
    } else {
      const auto k = static_cast<std::int64_t>(std::floor(t.ratio * double(w.numel())));
      at::Tensor flat = at::ones({w.numel()}, at::kFloat);
      if (k > 0)
        flat.index_fill_(0, std::get<1>(t.scores.flatten().sort(/*stable=*/true, 0, false)).slice(0, 0, k), 0.0);
      mask = flat.view(w.sizes());
    }
    at::Tensor out = w * mask.to(w.scalar_type());
    pruned.initializers[t.ref.name] = out;
    add_layer(r, n, t.ref.name, w, out);
    if (auto m = means.find(t.ref.node); m != means.end()) {
      // Only where this node alone reads the weight: a shared weight's nodes see other inputs.
      const at::Tensor delta = readers.at(t.ref.name) == 1 ? bias_shift(n, w, out, m->second) : at::Tensor();
      if (delta.defined()) {
        add_to_bias(pruned, t.ref.node, delta, readers);
        ++r.bias_compensated;
      }
    }
  }
  r.pruned = Model{std::move(pruned), model.meta};
  r.masked = Model{r.pruned.graph.clone(), model.meta};
}

}  // namespace sparsebit::prune_detail
