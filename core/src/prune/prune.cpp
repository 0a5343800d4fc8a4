// Pruning (sparsebit/core/prune.h): the entry point, fine-tuning and the helpers the pruning
// files share (prune_internal.h).

#include "sparsebit/core/prune.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/optim/adam.h>

#include <algorithm>

#include "base/core_ops.h"
#include "base/glob.h"
#include "base/log.h"
#include "prune/prune_internal.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "train/distill_epoch.h"

namespace sparsebit {
namespace prune_detail {

/// Runs `graph` on `sample` and records the shape of every tensor a node reads and of the outputs.
Shapes run_shapes(const Graph& graph, const Registry& registry, const std::vector<at::Tensor>& sample,
                  std::vector<at::Tensor>* outputs) {
  Executor ex(graph, registry);
  std::map<std::string, at::Tensor> feeds;
  if (sample.size() != graph.inputs.size()) {
    throw Error("the sample has " + std::to_string(sample.size()) + " inputs, the model " +
                std::to_string(graph.inputs.size()));
  }
  for (std::size_t i = 0; i < sample.size(); ++i) feeds[graph.inputs[i].name] = sample[i];
  Shapes shapes;
  c10::InferenceMode guard;
  auto result = ex.run(feeds, [&](std::size_t node, std::size_t input, const at::Tensor& v) {
    if (v.defined() && !v.is_nested()) shapes[ex.flat_node(node).inputs[input]] = v.sizes().vec();
    return v;
  });
  for (std::size_t i = 0; i < result.size() && i < graph.outputs.size(); ++i)
    if (result[i].defined() && !result[i].is_nested()) shapes[graph.outputs[i].name] = result[i].sizes().vec();
  if (outputs) *outputs = std::move(result);
  return shapes;
}

std::string pattern_name(SparsityPattern p) {
  switch (p) {
    case SparsityPattern::kElement: return "element";
    case SparsityPattern::kNM: return "N:M";
    case SparsityPattern::kChannel: return "channel";
  }
  return "?";
}

/// Ratio for a node: the first matching [[sparse.specific]], else [sparse] ratio.
double ratio_for(const SparseConfig& s, const std::string& node) {
  for (const auto& e : s.specific)
    if (node_matches_any(node, e.nodes)) return e.ratio;
  return s.ratio;
}

at::Tensor checked_scores(Sparser& sparser, const std::string& name, const at::Tensor& w, std::int64_t channel_axis,
                          const Node& n, SparsityPattern pattern) {
  const std::int64_t axis = channel_axis < 0 ? channel_axis + w.dim() : channel_axis;
  const std::int64_t input_axis = axis == 0 ? 1 : 0;
  at::Tensor s;
  try {
    s = sparser.scores(SparseWeight{w, axis, input_axis, n.name});
  } catch (const std::exception& e) {
    throw Error("sparser '" + name + "' failed on " + n.describe() + ": " + e.what());
  }
  const std::vector<std::int64_t> expect =
      pattern == SparsityPattern::kChannel ? std::vector<std::int64_t>{w.size(axis)} : w.sizes().vec();
  if (!s.defined() || s.sizes().vec() != expect) {
    throw Error("sparser '" + name + "' returned scores of shape " + (s.defined() ? c10::str(s.sizes()) : "undefined") +
                " for " + n.describe() + "; expected " + c10::str(at::IntArrayRef(expect)));
  }
  s = s.detach().to(at::kCPU, at::kDouble);
  if (!at::isfinite(s).all().item<bool>() || (s < 0).any().item<bool>())
    throw Error("sparser '" + name + "' returned negative or non-finite scores for " + n.describe());
  return s;
}

void add_layer(PruneResult& r, const Node& n, const std::string& weight, const at::Tensor& before,
               const at::Tensor& after) {
  LayerSparsity l;
  l.node = n.name;
  l.op_type = n.op_type;
  l.weight = weight;
  l.shape_before = before.sizes().vec();
  l.shape_after = after.sizes().vec();
  l.params_before = before.numel();
  l.params_after = after.numel();
  l.nonzero_after = after.count_nonzero().item<std::int64_t>();
  l.sparsity = l.params_before ? 1.0 - double(l.nonzero_after) / double(l.params_before) : 0;
  r.layers.push_back(std::move(l));
}

/// Writes `value` for input `input` of node `node`: in place when nobody else reads the
/// initializer, else under a new name.
void set_input_constant(Graph& g, std::size_t node, std::size_t input, at::Tensor value,
                        const std::map<std::string, int>& readers) {
  Node& n = g.node(node);
  const std::string& name = n.inputs[input];
  auto it = readers.find(name);
  if ((it != readers.end() && it->second > 1) || g.is_graph_output(name)) {
    const std::string fresh = g.unique_name(name + "_pruned");
    g.initializers[fresh] = std::move(value);
    n.inputs[input] = fresh;
  } else {
    g.initializers[name] = std::move(value);
  }
}

Graph reading_initializers_directly(const Graph& graph) {
  Graph g = graph.clone();
  for (Node* n : g.nodes()) {
    if (!core_ops::is(*n, core_ops::kIdentity) || !n->has_input(0) || !g.initializers.count(n->inputs[0]) ||
        g.is_graph_output(n->outputs[0]))
      continue;
    for (auto& [reader, k] : g.consumers(n->outputs[0])) reader->inputs[k] = n->inputs[0];
  }
  g.prune_dead();
  return g;
}

std::map<std::string, int> initializer_readers(const Graph& g) {
  std::map<std::string, int> readers;
  for (const Node* n : g.nodes())
    for (const auto& in : n->inputs)
      if (g.initializers.count(in)) ++readers[in];
  return readers;
}

}  // namespace prune_detail

using namespace prune_detail;

PruneResult prune(const Model& model, const Config& config, const Registry& registry,
                  const std::vector<at::Tensor>& sample, Dataset* data) {
  if (!config.sparse) throw Error(config.source + ": no [sparse] table: nothing says how to prune");
  const SparseConfig& cfg = *config.sparse;
  const auto* entry = registry.sparser(cfg.sparser);
  if (!entry) {
    const auto known = registry.names("sparser");
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    const std::string hint = nearest(cfg.sparser, known);
    throw Error(config.source + ": sparse.sparser: no plugin provides sparser '" + cfg.sparser + "'" +
                (hint.empty() ? "" : "; did you mean '" + hint + "'?") + " (loaded: " + (list.empty() ? "none" : list) +
                ")");
  }
  Options options = cfg.sparser_options;
  std::unique_ptr<Sparser> sparser;
  try {
    sparser = entry->factory(SparserContext{options, "[sparse.sparser_options]"});
  } catch (const std::exception& e) {
    throw Error(config.source + ": sparser '" + cfg.sparser + "' (plugin '" + entry->plugin + "'): " + e.what());
  }
  for (const auto& key : options.unused())
    throw Error(config.source + ": sparse.sparser_options." + key + ": sparser '" + cfg.sparser +
                "' has no such option");

  PruneResult r;
  r.sparser = cfg.sparser;
  r.pattern = sparser->pattern();
  // granularity must agree with what the sparser does; for N:M it sets N and M.
  const std::string& gran = cfg.granularity;
  const std::string what = pattern_name(r.pattern);
  if (r.pattern == SparsityPattern::kNM) {
    r.n = 2, r.m = 4;
    if (!gran.empty()) {
      const auto colon = gran.find(':');
      try {
        if (colon == std::string::npos) throw std::invalid_argument(gran);
        r.n = std::stoll(gran.substr(0, colon));
        r.m = std::stoll(gran.substr(colon + 1));
      } catch (const std::exception&) {
        throw Error(config.source + ": sparse.granularity: sparser '" + cfg.sparser +
                    "' prunes N of every M weights; write it as \"2:4\"");
      }
      if (r.n < 1 || r.m < 2 || r.n >= r.m || r.m > 64)
        throw Error(config.source + ": sparse.granularity: need 1 <= N < M <= 64, got " + gran);
    }
    if (cfg.ratio_set)
      logs::warn("{}", config.source + ": sparse.ratio is ignored by an N:M sparser (it removes " +
                           std::to_string(r.m - r.n) + " of every " + std::to_string(r.m) + ")");
  } else if (!gran.empty() && gran != what && !(gran == "unstructured" && what == "element") &&
             !(gran == "structured" && what == "channel")) {
    const std::string want = gran == "channel" || gran == "structured"     ? "l1_structured"
                             : gran == "element" || gran == "unstructured" ? "l1_unstructured"
                                                                           : "n_m";
    throw Error(config.source + ": sparse.granularity = \"" + gran + "\" but sparser '" + cfg.sparser + "' prunes by " +
                what + "; use sparser = \"" + want + "\" or drop the key");
  }
  if (cfg.scope == "global" && r.pattern != SparsityPattern::kElement)
    throw Error(config.source + ": sparse.scope = \"global\" needs an element sparser (such as l1_unstructured)");
  for (const auto& e : cfg.specific) {
    bool any = false;
    for (const Node* n : model.graph.nodes()) any = any || node_matches_any(n->name, e.nodes);
    if (!any) logs::warn("{}", config.source + ": " + e.name + " matches no node of the model");
  }

  r.before = model_stats(model, registry, sample);
  Dataset* stats_data = cfg.bias_compensation ? data : nullptr;
  if (r.pattern == SparsityPattern::kChannel) prune_channels(model, config, *sparser, registry, sample, stats_data, r);
  else prune_elements(model, config, *sparser, registry, stats_data, r);
  r.after = model_stats(r.pruned, registry, sample);
  if (r.layers.empty())
    logs::warn("{}", model.meta.source_path +
                         ": nothing to prune: no Conv, ConvTranspose, Gemm or MatMul reads a float constant "
                         "weight (a QDQ model? prune the float model, then quantize)");
  return r;
}

std::vector<double> finetune(Model& student, const Model& teacher, const Registry& registry,
                             const std::function<std::unique_ptr<Dataset>()>& open_train, const QatConfig& settings,
                             const std::string& device, const FinetuneProgressFn& progress) {
  Graph& g = student.graph;
  Executor ex(g, registry);
  Executor teacher_ex(teacher.graph, registry);
  ex.to(device);
  teacher_ex.to(device);
  // Trainable: weights and biases of weighted nodes, and constants ops mark trainable.
  std::vector<std::string> names;
  std::map<std::string, at::Tensor> masks;
  for (std::size_t i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    const auto specs = ex.modules()[i].module->input_specs();
    bool weighted = false;
    for (const auto& s : specs) weighted = weighted || s.role == InputRole::kWeight;
    for (std::size_t k = 0; k < specs.size() && k < n.inputs.size(); ++k) {
      const bool wb = weighted && (specs[k].role == InputRole::kWeight || specs[k].role == InputRole::kBias);
      if (!(wb || specs[k].trainable) || !n.has_input(k)) continue;
      auto c = ex.constants().find(n.inputs[k]);
      if (c == ex.constants().end() || !c->second.is_floating_point()) continue;
      if (std::find(names.begin(), names.end(), n.inputs[k]) != names.end()) continue;
      names.push_back(n.inputs[k]);
      if (specs[k].role == InputRole::kWeight && (c->second == 0).any().item<bool>())
        masks[n.inputs[k]] = (c->second != 0).to(c->second.scalar_type());
      ex.set_constant(n.inputs[k], c->second.detach().clone().set_requires_grad(true));
    }
  }
  if (names.empty()) throw Error("fine-tuning: the model has no weights to train");
  std::vector<at::Tensor> params;
  for (const auto& name : names) params.push_back(ex.constants().at(name));
  FusedAdam adam(params, torch::optim::AdamOptions(settings.lr).weight_decay(settings.weight_decay));
  if (at::Device(device).is_cuda()) (void)adam.count_steps_on_device();  // as QAT does (Note [CUDA graph steps])
  std::vector<double> losses;
  std::map<std::string, at::Tensor> feeds;
  const detail::DistillStep step{[&](const std::vector<at::Tensor>& in) {
                                   for (std::size_t i = 0; i < in.size(); ++i) feeds[g.inputs[i].name] = in[i];
                                   return ex.run(feeds);
                                 },
                                 teacher_ex,
                                 g.inputs,
                                 at::Device(device),
                                 settings,
                                 adam,
                                 [&] {  // zeros left by pruning stay zero
                                   c10::NoGradGuard no_grad;
                                   for (const auto& [name, mask] : masks) ex.constants().at(name).mul_(mask);
                                 },
                                 "fine-tuning"};
  for (int epoch = 1; epoch <= settings.epochs; ++epoch) {
    losses.push_back(detail::distill_epoch(step, epoch, open_train, progress).loss);
    logs::info("{}", "fine-tuning epoch " + std::to_string(epoch) + "/" + std::to_string(settings.epochs) + ": loss " +
                         std::to_string(losses.back()));
  }
  for (const auto& name : names) g.initializers[name] = ex.constants().at(name).detach().to(at::kCPU).clone();
  return losses;
}

}  // namespace sparsebit
