// QuantModel's JSON report: every quantized input with its scheme and parameters.

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {


std::string QuantModel::report_json(const CalibrationStats* stats) const {
  using nlohmann::json;
  auto values = [](const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU, at::kDouble).contiguous().reshape({-1});
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  json j;
  j["model"] = model_->meta.source_path;
  j["source_opset"] = model_->meta.source_opset;
  j["backend"] = config_.backend;
  j["config"] = config_.source;
  j["nodes"] = model_->graph.num_nodes();
  json slots = json::array();
  for (const auto& s : this->slots()) {
    json e;
    e["node"] = s.node_name;
    e["op_type"] = s.op_type;
    e["input_index"] = s.input_index;
    e["tensor"] = s.tensor;
    e["role"] = s.role == InputRole::kWeight ? "weight" : s.role == InputRole::kBias ? "bias" : "activation";
    e["scheme"] = s.spec.qscheme();
    e["bits"] = s.spec.bits;
    if (s.spec.per_channel) e["axis"] = s.spec.channel_axis;
    e["observer"] = s.observer_name;
    e["quantizer"] = s.quantizer_name;
    e["calibrated"] = s.calibrated;
    e["fake_fused"] = s.fake_fused;
    e["enabled"] = s.enabled;
    if (s.calibrated) {
      QParams p = s.role == InputRole::kBias ? s.bias_params : s.quantizer->qparams();
      e["scale"] = values(p.scale);
      e["zero_point"] = values(p.zero_point);
    }
    slots.push_back(e);
  }
  j["quantized_inputs"] = slots;
  if (stats) {
    j["calibration"] = {{"samples", stats->samples},
                        {"batches", stats->batches},
                        {"seconds", stats->seconds},
                        {"mode", stats->mode},
                        {"peak_cached_tensors", stats->peak_cached_tensors},
                        {"peak_cached_bytes", stats->peak_cached_bytes},
                        {"layer_pass_changes", stats->layer_pass_changes}};
    auto& rec = j["calibration"]["reconstructions"] = nlohmann::json::array();
    for (const auto& r : stats->reconstructions)
      rec.push_back({{"node", r.node}, {"mse_nearest", r.mse_nearest}, {"mse_learnt", r.mse_learnt},
                     {"iterations", r.iterations}, {"seconds", r.seconds}});
  }
  return j.dump(2);
}

}  // namespace sparsebit
