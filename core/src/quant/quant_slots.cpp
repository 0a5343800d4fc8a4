#include "sparsebit/core/quant_slots.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>

#include "base/glob.h"
#include "base/log.h"
#include "quant/plugin_call.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

std::string QuantSlot::where() const {
  const char* kind = role == InputRole::kWeight ? "weight" : role == InputRole::kBias ? "bias" : "activation";
  return std::string(kind) + " input " + std::to_string(input_index) + " ('" + tensor + "') of node '" + node_name +
         "' (" + op_type + ")";
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

/// The config's quantization tables: (name for messages, table, whether it is for weights).
std::vector<std::tuple<std::string, const QuantTableConfig*, bool>> tables_of(const Config& config) {
  std::vector<std::tuple<std::string, const QuantTableConfig*, bool>> tables = {{"[w]", &config.w, true},
                                                                                {"[a]", &config.a, false}};
  for (const auto& e : config.specific) {
    tables.emplace_back(e.name + " w", &e.w, true);
    tables.emplace_back(e.name + " a", &e.a, false);
  }
  return tables;
}

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

// The QuantState that fuse passes and the backend's placement see.
class QuantSlots::State final : public QuantState {
 public:
  explicit State(QuantSlots& slots) : slots_(slots) {
    for (std::size_t i = 0; i < slots.executor_->flat_size(); ++i) index_[&slots.executor_->flat_node(i)] = i;
  }
  const Graph& graph() const override { return *slots_.graph_; }
  bool is_quantized(const Node& node, std::size_t input) const override {
    const QuantSlot* s = slots_.at(index_of(node), input);
    return s && !s->fake_fused;
  }
  void set_fake_fused(const Node& node, std::size_t input, bool fused) override {
    if (QuantSlot* s = slots_.at(index_of(node), input)) s->fake_fused = fused;
  }
  bool quantize_activation(const Node& node, std::size_t input) override {
    const std::size_t i = index_of(node);
    if (!node.has_input(input) || slots_.is_constant(i, node.inputs[input]) ||
        node_matches_any(node.name, slots_.config_->skip))
      return false;
    if (QuantSlot* s = slots_.at(i, input)) {
      s->fake_fused = false;
      return true;
    }
    return slots_.add(i, input, InputRole::kActivation, 0) >= 0;
  }
  const QSpec* input_spec(const Node& node, std::size_t input) const override {
    const QuantSlot* s = slots_.at(index_of(node), input);
    return s ? &s->spec : nullptr;
  }
  std::int64_t value_elements(const std::string& value) const override {
    if (!sizes_) {
      sizes_.emplace();
      if (slots_.value_sizes_) {
        try {
          *sizes_ = slots_.value_sizes_();
        } catch (const Error& e) {
          logs::debug("{}", std::string("value sizes unknown to the placement: ") + e.what());
        }
      }
    }
    auto it = sizes_->find(value);
    return it == sizes_->end() ? -1 : it->second;
  }
  void tie_grid(const Node& node, std::size_t input, const Node& source, std::size_t source_input) override {
    slots_.ties_.push_back({{index_of(node), input}, {index_of(source), source_input}});
  }

 private:
  std::size_t index_of(const Node& node) const {
    auto it = index_.find(&node);
    if (it == index_.end()) throw Error("a pass referred to a node outside the model");
    return it->second;
  }
  QuantSlots& slots_;
  std::map<const Node*, std::size_t> index_;
  mutable std::optional<std::map<std::string, std::int64_t>> sizes_;
};

// Places the slots of Note [Quantization slots].
QuantSlots::QuantSlots(const Graph& graph, const Executor& executor, const Config& config, const Backend& backend,
                       std::string backend_plugin, const Registry& registry)
    : graph_(&graph),
      executor_(&executor),
      backend_(&backend),
      backend_name_(config.backend),
      backend_plugin_(std::move(backend_plugin)),
      config_(&config),
      registry_(&registry) {
  // Nodes of every nesting level (Note [Flat node numbering]): Conv/MatMul in a branch or a
  // loop body are quantized like any other, their observers fed at every iteration.
  slot_of_.assign(executor.flat_size(), {});
  for (std::size_t i = 0; i < executor.flat_size(); ++i) {
    const Node& n = executor.flat_node(i);
    slot_of_[i].assign(n.inputs.size(), -1);
    if (node_matches_any(n.name, config.skip)) {
      logs::debug("{}", n.describe() + " kept in float (skip)");
      continue;
    }
    const auto specs = executor.flat_module(i).module->input_specs();
    std::vector<std::size_t> bias_inputs;
    for (std::size_t k = 0; k < n.inputs.size() && k < specs.size(); ++k) {
      if (specs[k].role == InputRole::kFloat || !n.has_input(k)) continue;
      // A constant in an activation position (a bias Add, a Concat with a fixed tensor) stays
      // in float: it has no calibration data, and the backend folds it.
      if (specs[k].role == InputRole::kActivation && is_constant(i, n.inputs[k])) continue;
      if (specs[k].role == InputRole::kBias) bias_inputs.push_back(k);
      else if (specs[k].lookup_table) add_lookup_table(i, k, specs[k].channel_axis);
      else add(i, k, specs[k].role, specs[k].channel_axis);
    }
    if (backend.quantize_bias()) add_bias_slots(i, bias_inputs);
  }
  state_ = std::make_unique<State>(*this);
}

QuantSlots::~QuantSlots() = default;
QuantSlots::QuantSlots(QuantSlots&&) noexcept = default;

void QuantSlots::set_value_sizes(std::function<std::map<std::string, std::int64_t>()> compute) {
  value_sizes_ = std::move(compute);
}

QuantState& QuantSlots::state() {
  if (!state_) throw Error("internal: the slots are built; passes and placement run before finish_building()");
  return *state_;
}

void QuantSlots::finish_building() {
  for (const auto& s : slots_) {
    if (!s.active()) continue;
    if (auto why = backend_->check_input(executor_->flat_node(s.node_index), s.input_index, s.role, s.spec)) {
      throw Error(s.where() + ": backend '" + backend_name_ + "' cannot deploy " + s.spec.describe() + ": " + *why +
                  " (change the config, or keep the node in float with `skip`)");
    }
  }
  // Options must all have been read by the plugins they were meant for; tables no node used
  // are checked too, by constructing their objects once.
  for (const auto& [table, cfg, is_weight] : tables_of(*config_)) {
    if (cfg->disable) continue;
    if (!used_tables_.count(cfg)) probe_options(*cfg, is_weight);
    refuse_unused(cfg->observer_options, "observer", cfg->observer);
    refuse_unused(cfg->quantizer_options, "quantizer", cfg->quantizer);
  }
  used_tables_.clear();
  state_.reset();
  value_sizes_ = nullptr;
  config_ = nullptr;
  registry_ = nullptr;  // the slots need nothing more from the registry
}

namespace {
/// Where a quantizer name is a pass's (awq transforms the graph, then any quantizer rounds).
std::string pass_hint(const Registry& registry, const std::string& name) {
  if (!registry.pass(name)) return "";
  return "; '" + name + "' is a pass: keep a quantizer here (rtn, gptq) and turn it on with [schedule] " + name +
         " = true";
}
}  // namespace

const QuantTableConfig& QuantSlots::table_for(const Node& n, bool is_weight) const {
  for (const auto& e : config_->specific)
    if ((is_weight ? e.sets_w : e.sets_a) && node_matches_any(n.name, e.nodes)) return is_weight ? e.w : e.a;
  return is_weight ? config_->w : config_->a;
}

void QuantSlots::probe_options(const QuantTableConfig& cfg, bool is_weight) {
  QSpec spec = cfg.spec(is_weight, 0);
  const auto* obs = registry_->observer(cfg.observer);
  const auto* qz = registry_->quantizer(cfg.quantizer);
  const char* table = is_weight ? "w" : "a";
  if (!obs)
    throw Error(config_->source + ": [" + table + "] observer '" + printable(cfg.observer) +
                "' is not provided by any loaded plugin (available: " + join(registry_->names("observer")) + ")");
  if (!qz)
    throw Error(config_->source + ": [" + table + "] quantizer '" + printable(cfg.quantizer) +
                "' is not provided by any loaded plugin (available: " + join(registry_->names("quantizer")) + ")" +
                pass_hint(*registry_, cfg.quantizer));
  obs->factory(ObserverContext{spec, cfg.observer_options, "config check"});
  qz->factory(QuantizerContext{spec, cfg.quantizer_options, "config check"});
}

bool QuantSlots::is_constant(std::size_t node, const std::string& name) const {
  return graph_->initializers.count(name) || executor_->flat_constant(node, name);
}

const at::Tensor& QuantSlots::constant(std::size_t node, const std::string& name) const {
  if (const at::Tensor* t = executor_->flat_constant(node, name)) return *t;
  return graph_->initializers.at(name);
}

int QuantSlots::add(std::size_t i, std::size_t k, InputRole role, std::int64_t weight_axis) {
  const Node& n = executor_->flat_node(i);
  if (!n.has_input(k) || slot_of_[i][k] >= 0) return slot_of_[i][k];
  if (role == InputRole::kWeight && !is_constant(i, n.inputs[k])) {
    logs::debug("{}", n.describe() + ": weight input '" + n.inputs[k] + "' is computed, quantized as an activation");
    role = InputRole::kActivation;
  }
  const bool is_weight = role == InputRole::kWeight;
  const QuantTableConfig& cfg = table_for(n, is_weight);
  if (cfg.disable) return -1;
  used_tables_.insert(&cfg);
  std::int64_t axis = is_weight ? weight_axis : 1;
  if (is_weight && axis < 0) axis += constant(i, n.inputs[k]).dim();
  QuantSlot s = slot_for(n, i, k, role);
  s.spec = cfg.spec(is_weight, axis);
  s.observer_name = cfg.observer;
  s.quantizer_name = cfg.quantizer;
  const char* table = is_weight ? "w" : "a";
  const auto* obs = registry_->observer(cfg.observer);
  if (!obs) {
    throw Error(config_->source + ": [" + table + "] observer '" + cfg.observer +
                "' is not provided by any loaded plugin (available: " + join(registry_->names("observer")) + ")");
  }
  const auto* qz = registry_->quantizer(cfg.quantizer);
  if (!qz) {
    throw Error(config_->source + ": [" + table + "] quantizer '" + cfg.quantizer +
                "' is not provided by any loaded plugin (available: " + join(registry_->names("quantizer")) + ")" +
                pass_hint(*registry_, cfg.quantizer));
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
  refuse_float8_without_support(s, table);
  slot_of_[i][k] = static_cast<int>(slots_.size());
  slots_.push_back(std::move(s));
  return slot_of_[i][k];
}

// An embedding table is a weight only where the config asks for it and where it is one: a
// computed or integer "table" (Shape -> Gather chains) stays as it is.
void QuantSlots::add_lookup_table(std::size_t i, std::size_t k, std::int64_t row_axis) {
  const Node& n = executor_->flat_node(i);
  if (!table_for(n, true).embeddings || !is_constant(i, n.inputs[k])) return;
  const at::Tensor& table = constant(i, n.inputs[k]);
  if (table.dim() != 2 || !table.is_floating_point()) {
    logs::debug("{}", n.describe() + ": table '" + n.inputs[k] + "' is not a 2-D float constant; kept as it is");
    return;
  }
  const int idx = add(i, k, InputRole::kWeight, row_axis);
  if (idx >= 0) slots_[static_cast<std::size_t>(idx)].lookup_table = true;
}

void QuantSlots::add_bias_slots(std::size_t node, const std::vector<std::size_t>& bias_inputs) {
  const Node& n = executor_->flat_node(node);
  int act = -1, weight = -1;
  for (std::size_t k = 0; k < slot_of_[node].size(); ++k) {
    int idx = slot_of_[node][k];
    if (idx < 0) continue;
    if (slots_[static_cast<std::size_t>(idx)].role == InputRole::kActivation) act = act < 0 ? idx : -2;
    else weight = weight < 0 ? idx : -2;
  }
  if (act < 0 || weight < 0) return;  // no unique activation x weight product to scale by
  if (slots_[static_cast<std::size_t>(act)].spec.is_float8() ||
      slots_[static_cast<std::size_t>(weight)].spec.is_float8())
    return;  // float8 layers add a float bias
  for (std::size_t k : bias_inputs) {
    if (!is_constant(node, n.inputs[k]) || constant(node, n.inputs[k]).dim() != 1) continue;
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

std::optional<std::string> backend_rules(const Backend& backend, const QSpec& spec, const std::string& table) {
  if (!spec.is_float8()) return backend.check(spec, table);
  if (const auto* f8 = dynamic_cast<const DeploysFloat8*>(&backend)) return f8->check_float8(spec, table);
  return table + ".type = \"" + element_name(spec.element) +
         "\": this backend deploys no float8 tensors (backend = \"tensorrt\" or \"virtual\" do)";
}

// Note [Float8 elements]: a float8 spec goes only to objects that say they compute on it; an
// observer or quantizer built against an older SDK (or one that assumes an integer grid) would
// treat it as int8 without a word.
void QuantSlots::refuse_float8_without_support(const QuantSlot& s, const char* table) const {
  if (!s.spec.is_float8()) return;
  const std::string type = element_name(s.spec.element);
  if (!dynamic_cast<const HandlesFloat8Elements*>(s.observer.get()))
    throw Error(s.where() + ": [" + table + "] type = \"" + type + "\": observer '" + s.observer_name + "' (plugin '" +
                s.observer_plugin +
                "') does not compute float8 scales; use minmax, moving_average, percentile, mse or auto");
  if (!dynamic_cast<const HandlesFloat8Elements*>(s.quantizer.get()))
    throw Error(s.where() + ": [" + table + "] type = \"" + type + "\": quantizer '" + s.quantizer_name +
                "' (plugin '" + s.quantizer_plugin +
                "') learns or rounds on an integer grid; use quantizer = \"uniform\" (QAT trains through it "
                "straight-through)");
}

}  // namespace sparsebit
