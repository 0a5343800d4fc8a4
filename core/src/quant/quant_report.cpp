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
    e.qmin = s.spec.qmin();
    e.qmax = s.spec.qmax();
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
  r.bit_allocation = bit_allocation_;
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
    if (std::string module = module_path_of(s.node); !module.empty()) e["module"] = module;
    e["op_type"] = s.op_type;
    e["input_index"] = s.input_index;
    e["tensor"] = s.tensor;
    e["role"] = s.role == InputRole::kWeight ? "weight" : s.role == InputRole::kBias ? "bias" : "activation";
    e["scheme"] = s.scheme;
    e["bits"] = s.bits;
    e["qmin"] = s.qmin;
    e["qmax"] = s.qmax;
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
  if (r.bit_allocation) {
    const BitAllocation& b = *r.bit_allocation;
    json inputs = json::array();
    for (const auto& in : b.inputs) {
      json errors = json::object();
      for (const auto& [bits, e] : in.error) errors[std::to_string(bits)] = e;
      inputs.push_back({{"node", in.node},
                        {"tensor", in.tensor},
                        {"role", in.role == InputRole::kWeight ? "weight" : "activation"},
                        {"cost", in.cost},
                        {"bits", in.bits},
                        {"relative_error", errors}});
    }
    auto target = [](const std::optional<double>& t) { return t ? json(*t) : json(nullptr); };
    j["bit_allocation"] = {{"avg_weight_bits_target", target(b.weight_target)},
                           {"avg_activation_bits_target", target(b.activation_target)},
                           {"avg_weight_bits", b.weight_average},
                           {"avg_activation_bits", b.activation_average},
                           {"choices", b.choices},
                           {"samples", b.samples},
                           {"model_error", b.model_error},
                           {"seconds", b.seconds},
                           {"inputs", inputs}};
  }
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
                                             {"chosen", c.range_choices},
                                             {"judged_samples", c.range_judged_samples},
                                             {"departures", c.range_departures},
                                             {"kept_departures", c.range_kept_departures},
                                             {"output_error_default", c.range_output_error_default},
                                             {"output_error_kept", c.range_output_error_kept}};
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
