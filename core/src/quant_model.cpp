#include "sparsebit/core/quant_model.h"

#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/passes.h"
#include "layerwise.h"
#include "plugin_call.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <fnmatch.h>

#include <chrono>
#include <optional>
#include <set>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "glob.h"

namespace sparsebit {

std::string QuantSlot::where() const {
  const char* kind = role == InputRole::kWeight ? "weight" : role == InputRole::kBias ? "bias" : "activation";
  return std::string(kind) + " input " + std::to_string(input_index) +
         " ('" + tensor + "') of node '" + node_name + "' (" + op_type + ")";
}

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

void refuse_unused(const Options& o, const std::string& plugin_kind, const std::string& name) {
  auto unused = o.unused();
  if (!unused.empty()) {
    throw Error(o.where() + ": key" + (unused.size() > 1 ? "s " : " ") + join(unused) + " not understood by " +
                plugin_kind + " '" + name + "'; remove or correct " + (unused.size() > 1 ? "them" : "it"));
  }
}

}  // namespace

// The QuantState that fuse passes and the backend's placement see.
class SlotState final : public QuantState {
 public:
  explicit SlotState(QuantModel& qm) : qm_(qm) {
    std::size_t i = 0;
    for (const Node* n : qm.model_->graph.nodes()) index_[n] = i++;
  }
  const Graph& graph() const override { return qm_.model_->graph; }
  bool is_quantized(const Node& node, std::size_t input) const override {
    const QuantSlot* s = find(node, input);
    return s && !s->fake_fused;
  }
  void set_fake_fused(const Node& node, std::size_t input, bool fused) override {
    if (QuantSlot* s = find(node, input)) s->fake_fused = fused;
  }
  bool quantize_activation(const Node& node, std::size_t input) override {
    const std::size_t i = index_of(node);
    if (!node.has_input(input) || qm_.model_->graph.initializers.count(node.inputs[input]) ||
        matches_any(node.name, qm_.config_.skip))
      return false;
    if (QuantSlot* s = find(node, input)) {
      s->fake_fused = false;
      return true;
    }
    return qm_.add_slot(i, input, InputRole::kActivation, 0) >= 0;
  }

 private:
  std::size_t index_of(const Node& node) const {
    auto it = index_.find(&node);
    if (it == index_.end()) throw Error("a pass referred to a node outside the model");
    return it->second;
  }
  QuantSlot* find(const Node& node, std::size_t input) const {
    const auto& row = qm_.slot_of_[index_of(node)];
    if (input >= row.size() || row[input] < 0) return nullptr;
    return &qm_.slots_[static_cast<std::size_t>(row[input])];
  }
  QuantModel& qm_;
  std::map<const Node*, std::size_t> index_;
};

QuantModel::QuantModel(Model model, Config config, const Registry& registry)
    : model_(std::make_unique<Model>(std::move(model))), config_(std::move(config)), registry_(&registry) {
  // Per-channel Q/DQ needs opset 13, and lifting later would move the inputs quantizers refer to.
  if (model_->graph.default_opset() < 13) {
    try {
      lift_opset(model_->graph, 13, static_value_facts(model_->graph, model_->meta.value_info));
    } catch (const Error& e) {
      throw Error(model_->meta.source_path + ": " + e.what());
    }
  }
  const auto* backend = registry.backend(config_.backend);
  if (!backend) {
    throw Error(config_.source + ": backend '" + printable(config_.backend) + "' is not provided by any loaded plugin (installed: " +
                join(registry.names("backend")) + ")");
  }
  backend_ = backend->factory();
  backend_plugin_ = backend->plugin;
  std::vector<std::tuple<std::string, const QuantTableConfig*, bool>> tables = {{"[w]", &config_.w, true},
                                                                                {"[a]", &config_.a, false}};
  for (const auto& e : config_.specific) {
    tables.emplace_back(e.name + " w", &e.w, true);
    tables.emplace_back(e.name + " a", &e.a, false);
  }
  for (const auto& [table, cfg, is_weight] : tables) {
    if (cfg->disable) continue;
    if (auto why = backend_->check(cfg->spec(is_weight, is_weight ? 0 : 1), is_weight ? "w" : "a")) {
      throw Error(config_.source + ": " + table + " breaks the rules of backend '" + config_.backend + "': " + *why);
    }
  }

  // Simplify-stage passes rewrite the float graph before anything is bound to its nodes.
  run_passes(config_.schedule, Pass::Stage::kSimplify, model_->graph, registry, nullptr, config_.source);
  executor_ = std::make_unique<Executor>(model_->graph, registry);
  if (config_.calibration.device != "cpu") {
    at::Device dev(at::kCPU);
    try {
      dev = at::Device(config_.calibration.device);
    } catch (const std::exception&) {
      throw Error("device '" + config_.calibration.device + "' is not a device name (cpu, cuda, cuda:N)");
    }
    if (dev.is_cuda() && !at::hasCUDA()) {
      throw Error("device '" + config_.calibration.device +
                  "' requested, but this build of LibTorch has no CUDA support or no GPU is visible; use --device cpu");
    }
    executor_->to(config_.calibration.device);
  }

  const auto nodes = model_->graph.nodes();
  // A glob that matches nothing is almost always a typo or a model other than the one meant.
  auto warn_unmatched = [&](const std::vector<std::string>& globs, const std::string& key) {
    for (const auto& glob : globs) {
      if (std::any_of(nodes.begin(), nodes.end(), [&](const Node* n) { return matches_any(n->name, {glob}); })) continue;
      sdk::log_warn(config_.source + ": " + key + " glob '" + printable(glob, 80) + "' matches no node of " +
                    printable(model_->meta.source_path) + " (" + std::to_string(nodes.size()) + " nodes" +
                    (nodes.empty() ? std::string() : ", e.g. '" + printable(nodes.front()->name, 80) + "'") +
                    "); `sparsebit inspect --json` lists them");
    }
  };
  warn_unmatched(config_.skip, "skip");
  for (const auto& e : config_.specific) warn_unmatched(e.nodes, e.name + " nodes");
  slot_of_.assign(nodes.size(), {});
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    slot_of_[i].assign(n.inputs.size(), -1);
    if (matches_any(n.name, config_.skip)) {
      sdk::log_debug(n.describe() + " kept in float (skip)");
      continue;
    }
    const auto specs = executor_->modules()[i].module->input_specs();
    std::vector<std::size_t> bias_inputs;
    for (std::size_t k = 0; k < n.inputs.size() && k < specs.size(); ++k) {
      if (specs[k].role == InputRole::kFloat || !n.has_input(k)) continue;
      // A constant in an activation position (a bias Add, a Concat with a fixed tensor) stays
      // in float: it has no calibration data, and the backend folds it.
      if (specs[k].role == InputRole::kActivation && model_->graph.initializers.count(n.inputs[k])) continue;
      if (specs[k].role == InputRole::kBias) bias_inputs.push_back(k);
      else add_slot(i, k, specs[k].role, specs[k].channel_axis);
    }
    if (backend_->quantize_bias()) add_bias_slots(i, bias_inputs);
  }
  SlotState state(*this);
  run_passes(config_.schedule, Pass::Stage::kFuse, model_->graph, registry, &state, config_.source);
  layer_passes_ = make_layer_passes(config_.schedule, registry);
  try {
    backend_->place(state);
  } catch (const Error& e) {
    throw Error("backend '" + config_.backend + "' (plugin '" + backend_plugin_ + "'): " + e.what());
  }
  for (const auto& s : slots_) {
    if (!s.active()) continue;
    if (auto why = backend_->check_input(model_->graph.node(s.node_index), s.input_index, s.role, s.spec)) {
      throw Error(s.where() + ": backend '" + config_.backend + "' cannot deploy " + s.spec.describe() + ": " + *why +
                  " (change the config, or keep the node in float with `skip`)");
    }
  }
  // Options must all have been read by the plugins they were meant for; tables no node used
  // are checked too, by constructing their objects once.
  for (const auto& [table, cfg, is_weight] : tables) {
    if (cfg->disable) continue;
    if (!used_tables_.count(cfg)) probe_options(*cfg, is_weight);
    refuse_unused(cfg->observer_options, "observer", cfg->observer);
    refuse_unused(cfg->quantizer_options, "quantizer", cfg->quantizer);
  }
  used_tables_.clear();
  registry_ = nullptr;  // the model needs nothing more from the registry
  std::size_t active = 0;
  for (const auto& s : slots_) active += s.active();
  sdk::log_info(std::to_string(nodes.size()) + " nodes, " + std::to_string(active) + " quantized inputs (" +
                std::to_string(slots_.size() - active) + " fused away)");
}

namespace {
QuantSlot slot_for(const Node& n, std::size_t node, std::size_t input, InputRole role) {
  QuantSlot s;
  s.node_index = node;
  s.input_index = input;
  s.node_name = n.name;
  s.op_type = n.op_type;
  s.tensor = n.inputs[input];
  s.role = role;
  return s;
}
}  // namespace

const QuantTableConfig& QuantModel::table_for(const Node& n, bool is_weight) const {
  for (const auto& e : config_.specific)
    if (matches_any(n.name, e.nodes)) return is_weight ? e.w : e.a;
  return is_weight ? config_.w : config_.a;
}

void QuantModel::probe_options(const QuantTableConfig& cfg, bool is_weight) {
  QSpec spec = cfg.spec(is_weight, 0);
  const auto* obs = registry_->observer(cfg.observer);
  const auto* qz = registry_->quantizer(cfg.quantizer);
  const char* table = is_weight ? "w" : "a";
  if (!obs) throw Error(config_.source + ": [" + table + "] observer '" + printable(cfg.observer) + "' is not provided by any loaded plugin (available: " + join(registry_->names("observer")) + ")");
  if (!qz) throw Error(config_.source + ": [" + table + "] quantizer '" + printable(cfg.quantizer) + "' is not provided by any loaded plugin (available: " + join(registry_->names("quantizer")) + ")");
  obs->factory(ObserverContext{spec, cfg.observer_options, "config check"});
  qz->factory(QuantizerContext{spec, cfg.quantizer_options, "config check"});
}

int QuantModel::add_slot(std::size_t i, std::size_t k, InputRole role, std::int64_t weight_axis) {
  const Node& n = model_->graph.node(i);
  if (!n.has_input(k) || slot_of_[i][k] >= 0) return slot_of_[i][k];
  if (role == InputRole::kWeight && !model_->graph.initializers.count(n.inputs[k])) {
    sdk::log_debug(n.describe() + ": weight input '" + n.inputs[k] + "' is computed, quantized as an activation");
    role = InputRole::kActivation;
  }
  const bool is_weight = role == InputRole::kWeight;
  const QuantTableConfig& cfg = table_for(n, is_weight);
  if (cfg.disable) return -1;
  used_tables_.insert(&cfg);
  std::int64_t axis = is_weight ? weight_axis : 1;
  if (is_weight && axis < 0) axis += model_->graph.initializers.at(n.inputs[k]).dim();
  QuantSlot s = slot_for(n, i, k, role);
  s.spec = cfg.spec(is_weight, axis);
  s.observer_name = cfg.observer;
  s.quantizer_name = cfg.quantizer;
  const char* table = is_weight ? "w" : "a";
  const auto* obs = registry_->observer(cfg.observer);
  if (!obs) {
    throw Error(config_.source + ": [" + table + "] observer '" + cfg.observer +
                "' is not provided by any loaded plugin (available: " + join(registry_->names("observer")) + ")");
  }
  const auto* qz = registry_->quantizer(cfg.quantizer);
  if (!qz) {
    throw Error(config_.source + ": [" + table + "] quantizer '" + cfg.quantizer +
                "' is not provided by any loaded plugin (available: " + join(registry_->names("quantizer")) + ")");
  }
  s.make_observer = obs->factory;
  s.make_quantizer = qz->factory;
  s.observer_plugin = obs->plugin;
  s.quantizer_plugin = qz->plugin;
  s.observer_options = cfg.observer_options;
  s.quantizer_options = cfg.quantizer_options;
  try {
    s.observer = obs->factory(ObserverContext{s.spec, cfg.observer_options, s.where()});
    s.quantizer = qz->factory(QuantizerContext{s.spec, cfg.quantizer_options, s.where()});
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(s.where() + ": creating observer '" + cfg.observer + "' (plugin '" + obs->plugin + "') or quantizer '" +
                cfg.quantizer + "' (plugin '" + qz->plugin + "') failed: " + e.what());
  }
  slot_of_[i][k] = static_cast<int>(slots_.size());
  slots_.push_back(std::move(s));
  return slot_of_[i][k];
}

void QuantModel::add_bias_slots(std::size_t node, const std::vector<std::size_t>& bias_inputs) {
  const Node& n = model_->graph.node(node);
  int act = -1, weight = -1;
  for (std::size_t k = 0; k < slot_of_[node].size(); ++k) {
    int idx = slot_of_[node][k];
    if (idx < 0) continue;
    if (slots_[static_cast<std::size_t>(idx)].role == InputRole::kActivation) act = act < 0 ? idx : -2;
    else weight = weight < 0 ? idx : -2;
  }
  if (act < 0 || weight < 0) return;  // no unique activation x weight product to scale by
  for (std::size_t k : bias_inputs) {
    auto init = model_->graph.initializers.find(n.inputs[k]);
    if (init == model_->graph.initializers.end() || init->second.dim() != 1) continue;
    QuantSlot s = slot_for(n, node, k, InputRole::kBias);
    s.spec.bits = 32;
    s.spec.symmetric = true;
    s.spec.per_channel = slots_[static_cast<std::size_t>(weight)].spec.per_channel;
    s.spec.channel_axis = 0;
    s.observer_name = s.quantizer_name = "derived";
    s.bias_activation = act;
    s.bias_weight = weight;
    slot_of_[node][k] = static_cast<int>(slots_.size());
    slots_.push_back(std::move(s));
  }
}

QuantModel::~QuantModel() = default;
QuantModel::QuantModel(QuantModel&&) noexcept = default;

bool QuantModel::usable(const QuantSlot& s) const {
  if (!s.active()) return false;
  if (s.role != InputRole::kBias) return true;
  // A bias is int32 only while both factors of its scale are quantized.
  return slots_[static_cast<std::size_t>(s.bias_activation)].active() && slots_[static_cast<std::size_t>(s.bias_weight)].active();
}

std::vector<QuantSlot*> QuantModel::matching(const std::string& node_glob, std::optional<InputRole> role) {
  std::vector<QuantSlot*> out;
  for (auto& s : slots_)
    if (s.role != InputRole::kBias && (!role || *role == s.role) && fnmatch(node_glob.c_str(), s.node_name.c_str(), 0) == 0)
      out.push_back(&s);
  return out;
}

std::size_t QuantModel::set_enabled(const std::string& node_glob, bool enabled, std::optional<InputRole> role) {
  auto found = matching(node_glob, role);
  for (QuantSlot* s : found) s->enabled = enabled;
  return found.size();
}

std::size_t QuantModel::set_bits(const std::string& node_glob, int bits, std::optional<InputRole> role) {
  if (bits < 2 || bits > 16) throw Error("set_bits: bits must be between 2 and 16, got " + std::to_string(bits));
  auto found = matching(node_glob, role);
  for (QuantSlot* s : found) {
    QSpec spec = s->spec;
    spec.bits = bits;
    for (const auto& why : {backend_->check(spec, s->role == InputRole::kWeight ? "w" : "a"),
                            backend_->check_input(model_->graph.node(s->node_index), s->input_index, s->role, spec)}) {
      if (why) throw Error(s->where() + ": " + std::to_string(bits) + " bits break the rules of backend '" + config_.backend + "': " + *why);
    }
    s->spec = spec;
    // New objects for the new grid; the previous calibration no longer applies.
    s->observer = s->make_observer(ObserverContext{s->spec, s->observer_options, s->where()});
    s->quantizer = s->make_quantizer(QuantizerContext{s->spec, s->quantizer_options, s->where()});
    s->calibrated = false;
  }
  // Biases derive from their activation and weight scales: recompute them at calibration.
  for (auto& s : slots_)
    if (s.role == InputRole::kBias) s.calibrated = false;
  return found.size();
}

void QuantModel::set_quant(bool weights, bool activations) {
  w_on_ = weights;
  a_on_ = activations;
}

at::Tensor QuantModel::apply_slot(std::size_t node, std::size_t input, const at::Tensor& x, bool force) {
  int idx = slot_of_[node][input];
  if (idx < 0) return x;
  QuantSlot& s = slots_[static_cast<std::size_t>(idx)];
  const bool on = force || (s.role == InputRole::kWeight ? w_on_ : a_on_);
  if (!on || !usable(s) || !x.is_floating_point()) return x;
  if (!s.calibrated) throw Error(s.where() + ": quantization is on but the model was not calibrated");
  if (s.role == InputRole::kBias) return force || (w_on_ && a_on_) ? fake_quantize(x, s.bias_params, s.spec) : x;
  at::Tensor y = plugin_call(s, false, "forward", [&] { return s.quantizer->forward(x); });
  if (!y.defined() || y.sizes() != x.sizes()) {
    throw Error(s.where() + ": quantizer '" + s.quantizer_name + "' (plugin '" + s.quantizer_plugin + "') forward returned " +
                (y.defined() ? "shape " + c10::str(y.sizes()) : std::string("no tensor")) + " for an input of shape " +
                c10::str(x.sizes()));
  }
  return y;
}

std::vector<at::Tensor> QuantModel::forward(const std::vector<at::Tensor>& inputs, const ValueFn& on_value) {
  const auto& gin = model_->graph.inputs;
  if (inputs.size() != gin.size()) {
    throw Error("the model has " + std::to_string(gin.size()) + " input(s), " + std::to_string(inputs.size()) + " given");
  }
  std::map<std::string, at::Tensor> feeds;
  for (std::size_t i = 0; i < gin.size(); ++i) feeds[gin[i].name] = inputs[i];
  if (!w_on_ && !a_on_ && !on_value) return executor_->run(feeds);
  const auto nodes = model_->graph.nodes();
  return executor_->run(feeds, [this, &on_value, &nodes](std::size_t n, std::size_t k, const at::Tensor& x) {
    if (on_value) on_value(nodes[n]->inputs[k], x);
    return apply_slot(n, k, x);
  });
}

void QuantModel::set_slot_enabled(std::size_t slot, bool enabled) { slots_.at(slot).enabled = enabled; }

CalibrationStats QuantModel::init_qat(Dataset& data, const ProgressFn& progress) {
  CalibrationStats stats = calibrate(data, progress);
  set_quant(true, true);
  trainable_.clear();
  std::set<std::string> seen;
  const auto nodes = model_->graph.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    bool quantized_weight = false;
    for (int idx : slot_of_[i])
      quantized_weight = quantized_weight || (idx >= 0 && slots_[static_cast<std::size_t>(idx)].role == InputRole::kWeight &&
                                              slots_[static_cast<std::size_t>(idx)].active());
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
  sdk::log_info("QAT: " + std::to_string(trainable_.size()) + " weight and bias tensors trainable, " +
                std::to_string(named_parameters().size() - trainable_.size()) + " quantizer parameters");
  return stats;
}

void QuantModel::train(bool on) {
  for (std::size_t i = 0; i < executor_->modules().size(); ++i) {
    try {
      executor_->modules()[i].module->set_training(on);
    } catch (const std::exception& e) {
      throw Error(model_->graph.node(i).describe() + " (plugin '" + executor_->modules()[i].plugin + "') set_training: " + e.what());
    }
  }
  training_ = on;
}

std::vector<std::pair<std::string, at::Tensor>> QuantModel::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& name : trainable_) out.emplace_back("weight " + name, executor_->constants().at(name));
  for (auto& s : slots_) {
    if (!s.active() || !s.quantizer) continue;
    const auto params = plugin_call(s, false, "parameters", [&] { return s.quantizer->parameters(); });
    for (std::size_t j = 0; j < params.size(); ++j)
      out.emplace_back("quantizer " + s.node_name + "#" + std::to_string(s.input_index) + "/" + std::to_string(j), params[j]);
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

at::Tensor QuantModel::observe_input(std::size_t node, std::size_t input, const at::Tensor& x) {
  const int idx = slot_of_[node][input];
  if (idx < 0) return x;
  QuantSlot& s = slots_[static_cast<std::size_t>(idx)];
  if (s.role != InputRole::kActivation || !s.active()) return x;
  if (!x.is_floating_point()) {
    // Integer or bool data (indices, masks, shape arithmetic) has nothing to quantize.
    sdk::log_debug(s.where() + ": carries " + std::string(c10::toString(x.scalar_type())) + " data, left unquantized");
    s.enabled = false;
    return x;
  }
  plugin_call(s, true, "observe", [&] { s.observer->observe(x); });
  return x;
}

CalibrationStats QuantModel::calibrate(Dataset& data, const ProgressFn& progress) {
  for (auto& s : slots_)
    if (s.observer) s.observer->reset();
  if (config_.calibration.mode != "streaming") return run_layerwise(*this, data, progress);
  std::string why;
  if (!layer_passes_.empty()) why = "pass '" + layer_passes_.front().name + "' works layer by layer";
  for (const auto& s : slots_)
    if (why.empty() && s.active() && s.role == InputRole::kWeight && s.quantizer->reconstruction())
      why = s.where() + " uses quantizer '" + s.quantizer_name + "', which learns by layer reconstruction";
  if (!why.empty()) {
    throw Error(config_.source + ": " + why + "; set [calibration] mode = \"layerwise\" or \"asym\" (now \"streaming\")");
  }

  // Inference mode only while data flows: quantizer parameters made afterwards must be
  // ordinary tensors that autograd (QAT) can train.
  std::optional<c10::InferenceMode> inference(std::in_place);
  const auto start = std::chrono::steady_clock::now();
  CalibrationStats stats;
  stats.mode = config_.calibration.mode;
  const auto& gin = model_->graph.inputs;
  Batcher batcher(data, gin, config_.calibration.batch_size, config_.calibration.count);
  const std::int64_t total = config_.calibration.count > 0 ? config_.calibration.count : data.num_samples().value_or(-1);
  const at::Device device(config_.calibration.device);
  // Memory is independent of the sample count: one batch in flight, observers stream.
  while (auto b = batcher.next()) {
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t i = 0; i < gin.size(); ++i) feeds[gin[i].name] = b->inputs[i].to(device);
    executor_->run(feeds, [this](std::size_t n, std::size_t k, const at::Tensor& x) { return observe_input(n, k, x); });
    stats.samples += b->inputs[0].size(0);
    ++stats.batches;
    if (progress) progress(stats.samples, total);
  }
  if (stats.samples == 0) throw Error("the calibration data " + data.describe() + " yielded no samples");
  inference.reset();
  {
    c10::NoGradGuard no_grad;
    finish_calibration();
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

/// Scale and zero point from an observer must have one value per tensor, per channel or per
/// group of the quantized tensor (checked against the weight itself where it is known).
void QuantModel::check_qparams(const QuantSlot& s, const QParams& p, const char* call) const {
  auto fail = [&](const std::string& why) {
    throw Error(s.where() + ": observer '" + s.observer_name + "' (plugin '" + s.observer_plugin + "') " + call + " " + why);
  };
  if (!p.scale.defined() || !p.zero_point.defined()) fail("returned no scale or zero point");
  if (p.scale.numel() != p.zero_point.numel()) fail("returned scale and zero point of different sizes");
  if (!s.spec.per_channel && s.spec.group_size == 0 && p.scale.numel() != 1)
    fail("returned " + std::to_string(p.scale.numel()) + " scales for a per-tensor scheme");
  if (s.spec.per_channel && s.spec.group_size == 0 && s.role == InputRole::kWeight) {
    const at::Tensor& w = executor_->constants().at(s.tensor);
    if (s.spec.channel_axis < w.dim() && p.scale.numel() != w.size(s.spec.channel_axis))
      fail("returned " + std::to_string(p.scale.numel()) + " scales for " + std::to_string(w.size(s.spec.channel_axis)) +
           " channels");
  }
}

void QuantModel::finish_calibration() {
  for (auto& s : slots_)
    if (s.active() && s.role != InputRole::kBias) finish_slot(s);
  for (auto& s : slots_)
    if (s.role == InputRole::kBias) finish_bias(s);
}

void QuantModel::finish_slot(QuantSlot& s) {
  if (s.role == InputRole::kWeight) {
    plugin_call(s, true, "reset", [&] { s.observer->reset(); });
    plugin_call(s, true, "observe", [&] { s.observer->observe(executor_->constants().at(s.tensor)); });
  }
  const QParams p = plugin_call(s, true, "compute", [&] { return s.observer->compute(); });
  check_qparams(s, p, "compute");
  plugin_call(s, false, "initialize", [&] { s.quantizer->initialize(p); });
  s.observer->reset();  // statistics are no longer needed
  s.calibrated = true;
}

// Bias scale = activation scale x weight scale(s): what an int32 accumulator adds.
void QuantModel::finish_bias(QuantSlot& s) {
  s.fake_fused = false;  // decided afresh from the current activation and weight slots
  const QuantSlot& act = slots_[static_cast<std::size_t>(s.bias_activation)];
  const QuantSlot& w = slots_[static_cast<std::size_t>(s.bias_weight)];
  const at::Tensor& bias = executor_->constants().at(s.tensor);
  const at::Tensor w_scale = w.calibrated ? w.quantizer->qparams().scale.to(at::kCPU, at::kFloat) : at::Tensor();
  if (!act.active() || !w.active() || !act.calibrated || !w.calibrated || act.spec.per_channel || w.spec.group_size > 0 ||
      (w.spec.per_channel && w_scale.numel() != bias.numel())) {
    s.fake_fused = true;  // the product has no single per-output scale: keep the bias float
    return;
  }
  s.bias_params.scale = act.quantizer->qparams().scale.to(at::kCPU, at::kFloat).reshape({}) * w_scale;
  s.bias_params.zero_point = at::zeros(s.bias_params.scale.sizes(), at::TensorOptions().dtype(at::kInt));
  s.calibrated = true;
}

}  // namespace sparsebit
