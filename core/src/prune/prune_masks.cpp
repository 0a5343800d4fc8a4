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
#include "sparsebit/sdk/op_traits.h"

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

}  // namespace

std::map<std::size_t, at::Tensor> activation_means(const Graph& g, const Registry& registry, Dataset& data,
                                                   const Config& config, const std::set<std::size_t>& nodes) {
  Executor ex(g, registry);
  Batcher batcher(data, g.inputs, config.calibration.batch_size, config.calibration.count);
  std::map<std::size_t, ActivationSums> sums;
  c10::InferenceMode guard;
  while (auto b = batcher.next()) {
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t i = 0; i < g.inputs.size(); ++i) feeds[g.inputs[i].name] = b->inputs[i];
    ex.run(feeds, [&](std::size_t node, std::size_t input, const at::Tensor& v) {
      if (input != 0 || !nodes.count(node) || !v.defined() || !v.is_floating_point() || v.dim() == 0) return v;
      const Node& n = g.node(node);
      const auto* layer = registry.op_trait<WeightedLayer>(n.op_type, n.domain);
      auto w = n.has_input(1) ? g.initializers.find(n.inputs[1]) : g.initializers.end();
      if (!layer || w == g.initializers.end()) return v;
      ActivationSums batch = layer->activation_sums(n, v, w->second.dim());
      if (!batch.sum.defined()) return v;
      auto& acc = sums[node];
      acc.sum = acc.sum.defined() ? acc.sum + batch.sum : batch.sum;
      acc.count += batch.count;
      return v;
    });
  }
  std::map<std::size_t, at::Tensor> means;
  for (auto& [node, s] : sums)
    if (s.count > 0) means[node] = s.sum / s.count;
  return means;
}

at::Tensor bias_shift(const Graph& g, const Registry& registry, const Node& n, const at::Tensor& w,
                      const at::Tensor& w_new, const at::Tensor& mean) {
  const auto* layer = registry.op_trait<WeightedLayer>(n.op_type, n.domain);
  const auto input = layer ? layer->bias_input(n) : std::nullopt;
  // A bias computed at run time cannot be rewritten as a constant: no compensation there.
  if (!input || (n.has_input(*input) && !g.initializers.count(n.inputs[*input]))) return {};
  return layer->bias_shift(n, (w - w_new).to(at::kDouble), mean);
}

void add_to_bias(Graph& g, const Registry& registry, std::size_t node, const at::Tensor& delta,
                 const std::map<std::string, int>& readers) {
  Node& n = g.node(node);
  const auto* layer = registry.op_trait<WeightedLayer>(n.op_type, n.domain);
  const auto input = layer ? layer->bias_input(n) : std::nullopt;
  if (!input) throw Error(n.describe() + ": bias compensation reached a layer without a bias input");
  const at::Tensor w = g.initializers.at(n.inputs[1]);
  if (!n.has_input(*input)) {
    const std::string name = g.unique_name(n.name + "_bias");
    g.initializers[name] = delta.to(w.scalar_type());
    if (n.inputs.size() <= *input) n.inputs.resize(*input + 1);
    n.inputs[*input] = name;
    return;
  }
  const at::Tensor b = g.initializers.at(n.inputs[*input]);
  set_input_constant(g, node, *input, (b + delta.to(b.scalar_type())).contiguous(), readers);
}

void prune_elements(const Model& model, const Config& config, Sparser& sparser, const Registry& registry, Dataset* data,
                    PruneResult& r) {
  const SparseConfig& cfg = *config.sparse;
  const std::string& sparser_name = cfg.sparser;
  const Graph g = reading_initializers_directly(model.graph);
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
    if (node_matches_any(n.name, cfg.skip)) continue;
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
    std::set<std::size_t> layers;
    for (const auto& t : targets)
      if (t.ref.input == 1) layers.insert(t.ref.node);
    means = activation_means(g, registry, *data, config, layers);
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
      const at::Tensor delta =
          readers.at(t.ref.name) == 1 ? bias_shift(g, registry, n, w, out, m->second) : at::Tensor();
      if (delta.defined()) {
        add_to_bias(pruned, registry, t.ref.node, delta, readers);
        ++r.bias_compensated;
      }
    }
  }
  r.pruned = Model{std::move(pruned), model.meta};
  r.masked = Model{r.pruned.graph.clone(), model.meta};
}

}  // namespace sparsebit::prune_detail
