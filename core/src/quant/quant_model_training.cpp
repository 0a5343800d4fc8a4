// QuantModel in training: QAT's initialization from calibration, training mode, and the
// learnable parameters and states an optimizer and a checkpoint see (quant_model.cpp builds,
// calibrates and exports).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <set>
#include <string>
#include <vector>

#include "base/log.h"
#include "quant/plugin_call.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

CalibrationStats QuantModel::init_qat(Dataset& data, const ProgressFn& progress) {
  CalibrationStats stats = calibrate(data, progress);
  init_qat();
  return stats;
}

void QuantModel::init_qat() {
  bool calibrated = false;
  for (const auto& s : slots_->all()) calibrated = calibrated || (s.active() && s.calibrated);
  if (!calibrated)
    throw Error(
        "init_qat() without data starts from a calibration: call calibrate() first, or pass init_qat() "
        "the calibration data");
  set_quant(true, true);
  trainable_.clear();
  std::set<std::string> seen;
  const auto nodes = model_->graph.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    bool quantized_weight = false;
    for (std::size_t k = 0; k < nodes[i]->inputs.size(); ++k) {
      const QuantSlot* s = slots_->at(i, k);
      quantized_weight = quantized_weight || (s && s->role == InputRole::kWeight && s->active());
    }
    const auto specs = executor_->modules()[i].module->input_specs();
    bool learns = quantized_weight;
    for (const auto& spec : specs) learns = learns || spec.trainable;
    if (!learns) continue;
    for (std::size_t k = 0; k < specs.size() && k < nodes[i]->inputs.size(); ++k) {
      const bool weight_or_bias = specs[k].role == InputRole::kWeight || specs[k].role == InputRole::kBias;
      if (!(weight_or_bias && quantized_weight) && !specs[k].trainable) continue;
      const std::string& name = nodes[i]->inputs[k];
      auto c = executor_->constants().find(name);
      if (c == executor_->constants().end() || !c->second.is_floating_point() || !seen.insert(name).second) continue;
      executor_->set_constant(name, c->second.detach().clone().set_requires_grad(true));
      trainable_.push_back(name);
    }
  }
  train(true);
  logs::info("{}", "QAT: " + std::to_string(trainable_.size()) + " weight and bias tensors trainable, " +
                       std::to_string(named_parameters().size() - trainable_.size()) + " quantizer parameters");
}

void QuantModel::train(bool on) {
  for (std::size_t i = 0; i < executor_->modules().size(); ++i) {
    try {
      executor_->modules()[i].module->set_training(on);
    } catch (const std::exception& e) {
      throw Error(model_->graph.node(i).describe() + " (plugin '" + executor_->modules()[i].plugin +
                  "') set_training: " + e.what());
    }
  }
  training_ = on;
}

std::vector<std::pair<std::string, at::Tensor>> QuantModel::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& name : trainable_) out.emplace_back("weight " + name, executor_->constants().at(name));
  for (auto& s : slots_->all()) {
    if (!s.active() || !s.quantizer) continue;
    const auto params = plugin_call(s, false, "parameters", [&] { return s.quantizer->parameters(); });
    for (std::size_t j = 0; j < params.size(); ++j)
      out.emplace_back("quantizer " + s.node_name + "#" + std::to_string(s.input_index) + "/" + std::to_string(j),
                       params[j]);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> QuantModel::named_states() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::set<std::string> seen;
  const auto nodes = model_->graph.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto specs = executor_->modules()[i].module->input_specs();
    for (std::size_t k = 0; k < specs.size() && k < nodes[i]->inputs.size(); ++k) {
      if (!specs[k].training_state) continue;
      auto c = executor_->constants().find(nodes[i]->inputs[k]);
      if (c != executor_->constants().end() && c->second.is_floating_point() && seen.insert(c->first).second)
        out.emplace_back("state " + c->first, c->second);
    }
  }
  return out;
}

std::vector<at::Tensor> QuantModel::parameters() {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

}  // namespace sparsebit
