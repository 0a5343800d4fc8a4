#include "sparsebit/core/bn_tuning.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <map>

#include "base/log.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit {

bool bn_tuning_enabled(const Config& config) { return config.passes.switched("bn_tuning").value_or(false); }

namespace {
/// Per-channel sums of one BatchNormalization's input over the tuning pass.
struct ChannelStats {
  std::string mean, var;  // the BN's initializers
  at::Tensor sum, sumsq;
  std::int64_t count = 0;
};
}  // namespace

Model tune_batchnorm(const Model& model, const Config& config, const Registry& registry, const DataSource& calib) {
  Config unfused = config;
  if (registry.pass("fuse_bn")) unfused.passes.switches["fuse_bn"] = false;
  QuantModel qm(Model{model.graph.clone(), model.meta}, unfused, registry);

  // BN inputs by tensor name; their statistics are private copies, updated in place.
  std::map<std::string, std::vector<ChannelStats>> by_input;
  const Graph& g = qm.graph();
  for (const Node* n : g.nodes()) {
    const auto* norm = qm.op_traits().trait<RunningStatistics>(n->op_type, n->domain);
    const auto stats = norm ? norm->statistics_inputs(*n) : std::nullopt;
    if (!stats || !g.initializers.count(n->inputs[stats->mean]) || !g.initializers.count(n->inputs[stats->var]))
      continue;
    by_input[n->inputs[0]].push_back({n->inputs[stats->mean], n->inputs[stats->var], {}, {}, 0});
  }
  if (by_input.empty()) {
    logs::info("{}", "bn_tuning: the model has no normalization with constant running statistics; nothing to tune");
    return Model{model.graph.clone(), model.meta};
  }
  std::size_t count = 0;
  for (const auto& [input, list] : by_input) count += list.size();
  if (calib.empty())
    throw Error(config.source + ": [schedule] bn_tuning re-estimates the statistics of " + std::to_string(count) +
                " BatchNormalization node(s) from calibration data, and none was given: pass calibration data "
                "(--calib; calib= in Python) or set bn_tuning = false");
  Executor& ex = qm.executor();
  for (auto& [input, list] : by_input)
    for (auto& s : list)
      for (const auto& name : {s.mean, s.var}) ex.set_constant(name, ex.constants().at(name).clone());
  const auto& constants = ex.constants();

  {
    auto data = calib.open(qm.graph().inputs);
    qm.calibrate(*data);
  }
  c10::InferenceMode guard;
  auto data = calib.open(qm.graph().inputs);
  Batcher batcher(*data, qm.graph().inputs, config.calibration.batch_size, config.calibration.count);
  const at::Device device(config.calibration.device);
  qm.set_quant(true, true);
  std::int64_t samples = 0;
  while (auto b = batcher.next()) {
    std::vector<at::Tensor> in;
    for (auto& t : b->inputs) in.push_back(t.to(device));
    qm.forward(in, [&](const std::string& name, const at::Tensor& x) {
      auto it = by_input.find(name);
      if (it == by_input.end() || x.dim() < 2) return;
      std::vector<std::int64_t> dims{0};
      for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
      const at::Tensor xd = x.to(at::kDouble);
      const at::Tensor sum = xd.sum(dims), sumsq = (xd * xd).sum(dims);
      const std::int64_t count = x.numel() / x.size(1);
      for (auto& s : it->second) {
        s.sum = s.sum.defined() ? s.sum + sum : sum;
        s.sumsq = s.sumsq.defined() ? s.sumsq + sumsq : sumsq;
        s.count += count;
        // This batch normalizes with its own statistics (the node reads these constants next).
        const at::Tensor mean = sum / count;
        constants.at(s.mean).copy_(mean);
        constants.at(s.var).copy_((sumsq / count - mean * mean).clamp_min(0));
      }
    });
    samples += b->rows;
  }
  if (samples == 0) throw Error("bn_tuning: " + calib.name() + " yielded no samples");

  Model tuned{model.graph.clone(), model.meta};
  std::size_t tuned_count = 0;
  for (auto& [input, list] : by_input) {
    for (auto& s : list) {
      if (s.count == 0) continue;
      const at::Tensor mean = s.sum / s.count, var = (s.sumsq / s.count - mean * mean).clamp_min(0);
      const auto dtype = tuned.graph.initializers.at(s.mean).scalar_type();
      tuned.graph.initializers[s.mean] = mean.to(at::kCPU, dtype).contiguous();
      tuned.graph.initializers[s.var] = var.to(at::kCPU, dtype).contiguous();
      ++tuned_count;
    }
  }
  logs::info("{}", "bn_tuning: re-estimated " + std::to_string(tuned_count) + " BatchNormalization layer(s) on " +
                       std::to_string(samples) + " samples with quantization on");
  return tuned;
}

}  // namespace sparsebit
