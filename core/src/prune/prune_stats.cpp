// What pruning reports: sample inputs, parameter / file size / MAC statistics, the JSON report.

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "prune/prune_internal.h"
#include "sparsebit/sdk/op_traits.h"
#include "prune/prune_report_value.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

using namespace prune_detail;

ModelStats model_stats(const Model& model, const Registry& registry, const std::vector<at::Tensor>& sample) {
  ModelStats s;
  const Graph& g = model.graph;
  for (const auto& [name, t] : g.initializers) {
    if (!t.is_floating_point()) continue;
    s.parameters += t.numel();
    s.nonzero_parameters += t.count_nonzero().item<std::int64_t>();
  }
  ExportOptions plain;
  plain.run_checker = false;
  std::string external;  // past protobuf's limit the large initializers go to a side file
  s.file_bytes = static_cast<std::int64_t>(serialize_onnx(g, model.meta, plain, &external, "model.onnx.data").size() +
                                           external.size());
  const Shapes shapes = run_shapes(g, registry, sample);
  auto shape = [&](const std::string& v) -> const Shape* {
    auto it = shapes.find(v);
    return it == shapes.end() ? nullptr : &it->second;
  };
  for (const Node* n : g.nodes()) {
    if (n->inputs.size() < 2 || n->outputs.empty()) continue;
    const Shape* x = shape(n->inputs[0]);
    const Shape* w = shape(n->inputs[1]);
    const Shape* y = shape(n->outputs[0]);
    const auto* layer = registry.op_trait<WeightedLayer>(n->op_type, n->domain);
    if (!x || !w || !layer) continue;
    const std::int64_t macs = layer->macs(*n, *x, *w, y);
    if (!macs) continue;
    s.macs += macs;
    double density = 1;
    if (auto it = g.initializers.find(n->inputs[1]); it != g.initializers.end() && it->second.numel())
      density = double(it->second.count_nonzero().item<std::int64_t>()) / double(it->second.numel());
    s.sparse_macs += static_cast<std::int64_t>(std::llround(double(macs) * density));
  }
  return s;
}

nlohmann::json prune_report_value(const PruneSummary& r) {
  using nlohmann::json;
  auto stats = [](const ModelStats& s) {
    return json{{"parameters", s.parameters}, {"nonzero_parameters", s.nonzero_parameters},
                {"file_bytes", s.file_bytes}, {"macs", s.macs},
                {"flops", 2 * s.macs},        {"sparse_macs", s.sparse_macs}};
  };
  json j;
  j["sparser"] = r.sparser;
  j["pattern"] = pattern_name(r.pattern);
  if (r.pattern == SparsityPattern::kNM) j["n_m"] = {r.n, r.m};
  j["before"] = stats(r.before);
  j["after"] = stats(r.after);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  j["ratios"] = {{"parameters", ratio(double(r.after.parameters), double(r.before.parameters))},
                 {"nonzero_parameters", ratio(double(r.after.nonzero_parameters), double(r.before.parameters))},
                 {"file_bytes", ratio(double(r.after.file_bytes), double(r.before.file_bytes))},
                 {"macs", ratio(double(r.after.macs), double(r.before.macs))},
                 {"sparse_macs", ratio(double(r.after.sparse_macs), double(r.before.macs))}};
  if (r.pattern == SparsityPattern::kChannel) {
    j["channel_groups"] = r.groups;
    j["channel_groups_pruned"] = r.groups_pruned;
    j["channels_removed"] = r.channels_removed;
    j["max_relative_difference_vs_masked"] = r.max_masked_difference;
  }
  j["bias_compensated_layers"] = r.bias_compensated;
  json layers = json::array();
  for (const auto& l : r.layers) {
    layers.push_back({{"node", l.node},
                      {"op", l.op_type},
                      {"weight", l.weight},
                      {"shape_before", l.shape_before},
                      {"shape_after", l.shape_after},
                      {"params_before", l.params_before},
                      {"params_after", l.params_after},
                      {"nonzero_after", l.nonzero_after},
                      {"sparsity", l.sparsity}});
  }
  j["layers"] = layers;
  j["notes"] = r.notes;
  return j;
}

std::string prune_report_json(const PruneSummary& r) {
  return prune_report_value(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sparsebit
