// QuantModel's report: every quantized input with its scheme and parameters, typed and as JSON.

#include <ATen/ATen.h>

#include "quant/quant_report_value.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {

QuantizationReport QuantModel::report(const CalibrationStats* stats) const {
  auto values = [](const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU, at::kDouble).contiguous().reshape({-1});
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  QuantizationReport r;
  r.model = model_->meta.source_path;
  r.source_opset = model_->meta.source_opset;
  r.backend = config_.backend;
  r.config = config_.source;
  r.nodes = model_->graph.num_nodes();
  for (const auto& s : slots()) {
    SlotReport e;
    e.node = s.node_name;
    e.op_type = s.op_type;
    e.input_index = s.input_index;
    e.tensor = s.tensor;
    e.role = s.role;
    e.scheme = s.spec.qscheme();
    e.bits = s.spec.bits;
    if (s.spec.per_channel) e.axis = s.spec.channel_axis;
    e.observer = s.observer_name;
    e.quantizer = s.quantizer_name;
    e.range = s.range;
    e.calibrated = s.calibrated;
    e.fake_fused = s.fake_fused;
    e.enabled = s.enabled;
    if (s.calibrated) {
      const QParams p = s.role == InputRole::kBias ? s.bias_params : s.quantizer->qparams();
      e.scale = values(p.scale);
      e.zero_point = values(p.zero_point);
    }
    r.slots.push_back(std::move(e));
  }
  if (stats) r.calibration = *stats;
  return r;
}

std::string QuantModel::report_json(const CalibrationStats* stats) const {
  return quantization_report_json(report(stats));
}

nlohmann::json quantization_report_value(const QuantizationReport& r) {
  using nlohmann::json;
  json j;
  j["model"] = r.model;
  j["source_opset"] = r.source_opset;
  j["backend"] = r.backend;
  j["config"] = r.config;
  j["nodes"] = r.nodes;
  json slots = json::array();
  for (const auto& s : r.slots) {
    json e;
    e["node"] = s.node;
    e["op_type"] = s.op_type;
    e["input_index"] = s.input_index;
    e["tensor"] = s.tensor;
    e["role"] = s.role == InputRole::kWeight ? "weight" : s.role == InputRole::kBias ? "bias" : "activation";
    e["scheme"] = s.scheme;
    e["bits"] = s.bits;
    if (s.axis) e["axis"] = *s.axis;
    e["observer"] = s.observer;
    e["quantizer"] = s.quantizer;
    if (!s.range.empty()) e["range"] = s.range;
    e["calibrated"] = s.calibrated;
    e["fake_fused"] = s.fake_fused;
    e["enabled"] = s.enabled;
    if (s.calibrated) {
      e["scale"] = s.scale;
      e["zero_point"] = s.zero_point;
    }
    slots.push_back(e);
  }
  j["quantized_inputs"] = slots;
  if (r.calibration) {
    const CalibrationStats& c = *r.calibration;
    j["calibration"] = {{"samples", c.samples},
                        {"batches", c.batches},
                        {"seconds", c.seconds},
                        {"mode", c.mode},
                        {"peak_cached_tensors", c.peak_cached_tensors},
                        {"peak_cached_bytes", c.peak_cached_bytes},
                        {"layer_pass_changes", c.layer_pass_changes}};
    if (c.range_selected_inputs > 0)
      j["calibration"]["range_selection"] = {{"inputs", c.range_selected_inputs},
                                             {"samples", c.range_selection_samples},
                                             {"seconds", c.range_selection_seconds},
                                             {"chosen", c.range_choices}};
    auto& rec = j["calibration"]["reconstructions"] = json::array();
    for (const auto& x : c.reconstructions)
      rec.push_back({{"node", x.node},
                     {"quantizer", x.quantizer},
                     {"mse_nearest", x.mse_nearest},
                     {"mse_learnt", x.mse_learnt},
                     {"iterations", x.iterations},
                     {"recorded_steps", x.recorded_steps},
                     {"seconds", x.seconds}});
  }
  return j;
}

std::string quantization_report_json(const QuantizationReport& report) {
  return quantization_report_value(report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sparsebit
