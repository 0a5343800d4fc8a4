// Channel removal (Note [Channel removal]): which channels of which tensors move together, then
// slicing every weight, bias and shape that reads them.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "base/glob.h"
#include "prune/channel_analysis.h"
#include "prune/prune_internal.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit::prune_detail {
namespace {

/// The axes of a layer the channel analysis made a producer or a consumer: one whose op has
/// the WeightedLayer trait and axes for this node.
LayerAxes layer_axes(const Registry& registry, const Node& n, std::int64_t weight_rank) {
  const auto* layer = registry.op_trait<WeightedLayer>(n.op_type, n.domain);
  const auto axes = layer ? layer->axes(n, weight_rank) : std::nullopt;
  if (!axes) throw Error(n.describe() + ": its op has no layer axes, yet channel removal made it a layer");
  return *axes;
}

/// The positions of a site's atoms whose channel class stays.
struct KeptPositions {
  ChannelAnalysis& an;
  const std::set<int>& removed;
  std::vector<std::int64_t> operator()(const std::vector<int>& atoms) const {
    std::vector<std::int64_t> keep;
    for (std::size_t pos = 0; pos < atoms.size(); ++pos)
      if (!removed.count(an.uf.find(atoms[pos]))) keep.push_back(static_cast<std::int64_t>(pos));
    return keep;
  }
};

/// The channel classes channel removal drops: producers are scored by the sparser (normalised
/// by each producer's mean so no layer dominates a group), grouped where their channels were
/// united, and each group drops its lowest-scoring classes down to its smallest ratio.
std::set<int> classes_to_remove(ChannelAnalysis& an, const Graph& g, const SparseConfig& cfg, Sparser& sparser,
                                const Registry& registry, PruneResult& r) {
  const std::string& sparser_name = cfg.sparser;
  std::vector<at::Tensor> scores(an.producers.size());
  for (std::size_t p = 0; p < an.producers.size(); ++p) {
    const Producer& pr = an.producers[p];
    const Node& n = g.node(pr.node);
    const at::Tensor& w = g.initializers.at(n.inputs[1]);
    const std::int64_t out_axis = layer_axes(registry, n, w.dim()).weight_out;
    at::Tensor s = checked_scores(sparser, sparser_name, w, out_axis, n, SparsityPattern::kChannel);
    const double mean = s.mean().item<double>();
    scores[p] = mean > 0 ? s / mean : at::ones_like(s);
  }

  // Groups: producers whose channels were united anywhere.
  UnionFind groups;
  for (std::size_t p = 0; p < an.producers.size(); ++p) groups.make();
  std::map<int, int> class_owner;  // class root -> a producer
  for (std::size_t p = 0; p < an.producers.size(); ++p) {
    for (int a : an.producers[p].atoms) {
      const int root = an.uf.find(a);
      auto [it, fresh] = class_owner.emplace(root, static_cast<int>(p));
      if (!fresh) groups.unite(static_cast<int>(p), it->second);
    }
  }
  std::map<int, double> class_score;
  std::map<int, std::string> class_pinned;  // class root -> why
  for (std::size_t a = 0; a < an.pinned.size(); ++a) {
    const int root = an.uf.find(static_cast<int>(a));
    if (an.pinned[a]) class_pinned.emplace(root, an.reason[static_cast<int>(a)]);
    const int p = an.atom_producer[a];
    if (p >= 0) class_score[root] += scores[static_cast<std::size_t>(p)][an.atom_channel[a]].item<double>();
  }
  std::map<int, std::vector<int>> group_producers;
  for (std::size_t p = 0; p < an.producers.size(); ++p)
    group_producers[groups.find(static_cast<int>(p))].push_back(static_cast<int>(p));

  std::set<int> removed;
  for (const auto& [gid, members] : group_producers) {
    std::set<int> classes;
    double ratio = 1;
    std::string names;
    for (int p : members) {
      const Producer& pr = an.producers[static_cast<std::size_t>(p)];
      ratio = std::min(ratio, pr.skipped ? 0.0 : pr.ratio);
      if (names.size() < 200) names += (names.empty() ? "" : ", ") + g.node(pr.node).name;
      for (int a : pr.atoms) classes.insert(an.uf.find(a));
    }
    ++r.groups;
    std::vector<std::pair<double, int>> candidates;
    for (int c : classes)
      if (!class_pinned.count(c)) candidates.push_back({class_score[c], c});
    const std::int64_t total = static_cast<std::int64_t>(classes.size());
    std::int64_t keep = total - static_cast<std::int64_t>(std::floor(ratio * double(total) + 1e-9));
    keep = std::max<std::int64_t>(1, ((keep + cfg.round_to - 1) / cfg.round_to) * cfg.round_to);
    const std::int64_t pinned = total - static_cast<std::int64_t>(candidates.size());
    std::int64_t drop = std::max<std::int64_t>(0, total - std::max(keep, pinned));
    std::string why;
    for (int c : classes)
      if (auto it = class_pinned.find(c); it != class_pinned.end() && why.empty()) why = it->second;
    if (pinned > 0 && ratio > 0)
      r.notes.push_back("channels of " + names + ": " + std::to_string(pinned) + " of " + std::to_string(total) +
                        " kept, held by " + why);
    if (drop == 0) continue;
    ++r.groups_pruned;
    std::stable_sort(candidates.begin(), candidates.end());
    for (std::int64_t k = 0; k < drop; ++k) removed.insert(candidates[static_cast<std::size_t>(k)].second);
    r.channels_removed += drop;
  }

  return removed;
}

/// Note [Bias compensation]: each consumer that lost input channels gives their mean
/// contribution back to its bias, in the pruned and in the masked model.
void compensate_biases(ChannelAnalysis& an, const Graph& g, const Registry& registry, Dataset& data,
                       const Config& config, const KeptPositions& keep_positions,
                       const std::map<std::string, int>& readers, Graph& pruned, Graph& masked, PruneResult& r) {
  std::set<std::size_t> consumers;
  for (const Site& s : an.sites)
    if (s.kind == Site::kConsumer) consumers.insert(s.node);
  const auto means = activation_means(g, registry, data, config, consumers);
  for (const Site& s : an.sites) {
    if (s.kind != Site::kConsumer || !means.count(s.node)) continue;
    const auto keep = keep_positions(s.atoms);
    if (keep.size() == s.atoms.size()) continue;
    const Node& n = g.node(s.node);
    const at::Tensor& w = g.initializers.at(n.inputs[1]);
    at::Tensor keep_mask = at::zeros({w.size(s.axis)}, w.options());
    keep_mask.index_fill_(0, at::tensor(keep, at::kLong), 1.0);
    std::vector<std::int64_t> view(static_cast<std::size_t>(w.dim()), 1);
    view[static_cast<std::size_t>(s.axis)] = w.size(s.axis);
    const at::Tensor delta = bias_shift(g, registry, n, w, w * keep_mask.view(view), means.at(s.node));
    if (!delta.defined()) continue;
    // Outputs this node keeps (it may lose some as a producer too).
    at::Tensor out_keep = at::ones({delta.size(0)}, at::kDouble);
    std::vector<std::int64_t> kept_outputs;
    for (const auto& p : an.producers)
      if (p.node == s.node) kept_outputs = keep_positions(p.atoms);
    if (!kept_outputs.empty() && static_cast<std::int64_t>(kept_outputs.size()) < delta.size(0)) {
      out_keep.zero_().index_fill_(0, at::tensor(kept_outputs, at::kLong), 1.0);
      add_to_bias(pruned, registry, s.node, delta.index_select(0, at::tensor(kept_outputs, at::kLong)), readers);
    } else {
      add_to_bias(pruned, registry, s.node, delta, readers);
    }
    add_to_bias(masked, registry, s.node, delta * out_keep, readers);
    ++r.bias_compensated;
  }
}

/// The shrunk model must compute what the masked one does (Note [Channel removal]).
void check_against_masked(const Graph& g, const Graph& pruned, const Graph& masked, const Registry& registry,
                          const std::vector<at::Tensor>& sample, PruneResult& r) {
  std::vector<at::Tensor> out_pruned, out_masked;
  try {
    run_shapes(pruned, registry, sample, &out_pruned);
  } catch (const std::exception& e) {
    throw Error(std::string("channel removal produced a model that does not run (") + e.what() +
                "); set [sparse] skip for the layer named there and report this model");
  }
  run_shapes(masked, registry, sample, &out_masked);
  for (std::size_t k = 0; k < out_masked.size(); ++k) {
    if (!out_masked[k].is_floating_point()) continue;
    if (out_pruned[k].sizes() != out_masked[k].sizes())
      throw Error("channel removal changed the shape of output '" + g.outputs[k].name + "'; report this model");
    const double scale = std::max(out_masked[k].abs().max().item<double>(), 1e-12);
    const double diff = (out_pruned[k] - out_masked[k]).abs().max().item<double>() / scale;
    r.max_masked_difference = std::max(r.max_masked_difference, diff);
  }
  if (r.max_masked_difference > 1e-4) {
    throw Error("channel removal changed the model's function (relative difference " +
                std::to_string(r.max_masked_difference) + " against the masked model); report this model");
  }
}

}  // namespace

void prune_channels(const Model& model, const Config& config, Sparser& sparser, const Registry& registry,
                    const std::vector<at::Tensor>& sample, Dataset* data, PruneResult& r) {
  const SparseConfig& cfg = *config.sparse;
  const Graph normalized = reading_initializers_directly(model.graph);
  const Graph& g = normalized;
  const Shapes shapes = run_shapes(g, registry, sample);
  ChannelAnalysis an(g, shapes, registry);
  an.run([&](const Node& n) -> std::pair<bool, double> {
    if (node_matches_any(n.name, cfg.skip)) return {false, 0.0};
    const double ratio = ratio_for(cfg, n.name);
    return {ratio > 0, ratio};
  });

  const std::set<int> removed = classes_to_remove(an, g, cfg, sparser, registry, r);

  const KeptPositions keep_positions{an, removed};
  const auto readers = initializer_readers(g);
  Graph pruned = g.clone();
  Graph masked = g.clone();
  for (const Site& s : an.sites) {
    const auto keep = keep_positions(s.atoms);
    if (keep.size() == s.atoms.size()) continue;
    // Read the current value: a weight may be sliced twice (input and output channels).
    const at::Tensor c = pruned.initializers.at(pruned.node(s.node).inputs[s.input]);
    set_input_constant(pruned, s.node, s.input, c.index_select(s.axis, at::tensor(keep, at::kLong)).contiguous(),
                       readers);
    if (s.kind != Site::kParam) {
      at::Tensor mask = at::ones({c.size(s.axis)}, c.options());
      mask.index_fill_(0, at::tensor(keep, at::kLong), 0.0);
      std::vector<std::int64_t> view(static_cast<std::size_t>(c.dim()), 1);
      view[static_cast<std::size_t>(s.axis)] = c.size(s.axis);
      // Zero where `mask` is 1 (the removed positions).
      const at::Tensor current = masked.initializers.at(masked.node(s.node).inputs[s.input]);
      set_input_constant(masked, s.node, s.input, current * (1 - mask.view(view)), readers);
    }
  }
  if (data) compensate_biases(an, g, registry, *data, config, keep_positions, readers, pruned, masked, r);
  for (const CountSite& s : an.counts) {
    const auto kept = static_cast<std::int64_t>(keep_positions(s.atoms).size());
    if (kept == static_cast<std::int64_t>(s.atoms.size())) continue;
    Node& n = pruned.node(s.node);
    if (s.input < 0) {
      n.attributes["group"] = Attribute::of_int(kept);
      continue;
    }
    at::Tensor dims = g.initializers.at(g.node(s.node).inputs[static_cast<std::size_t>(s.input)]).clone();
    dims[static_cast<std::int64_t>(s.position)] = kept;
    set_input_constant(pruned, s.node, static_cast<std::size_t>(s.input), dims, readers);
  }
  pruned.prune_dead();
  masked.prune_dead();

  // Layers whose weights changed.
  for (std::size_t i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    if (n.inputs.size() < 2 || !g.initializers.count(n.inputs[1])) continue;
    if (!registry.op_trait<WeightedLayer>(n.op_type, n.domain)) continue;
    add_layer(r, n, n.inputs[1], g.initializers.at(n.inputs[1]), pruned.initializers.at(pruned.node(i).inputs[1]));
  }

  check_against_masked(g, pruned, masked, registry, sample, r);
  r.pruned = Model{std::move(pruned), model.meta};
  r.masked = Model{std::move(masked), model.meta};
}

}  // namespace sparsebit::prune_detail
