#include "sparsebit/core/quant_model.h"

#include "base/log.h"
#include "quant/distributed_merge.h"
#include "quant/layerwise.h"
#include "quant/plugin_call.h"
#include "quant/qdq_export.h"
#include "quant/range_selection.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/matmul_nbits.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/passes.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <optional>
#include <set>
#include <tuple>

#include "base/glob.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}
/// Why streaming calibration cannot serve this model ("" when it can): a pass or a weight
/// quantizer that works on each layer's cached data.
std::string needs_layerwise(const std::vector<QuantSlot>& slots, const std::vector<LayerPass>& layer_passes) {
  if (!layer_passes.empty()) return "pass '" + layer_passes.front().name + "' works layer by layer";
  for (const auto& s : slots) {
    if (!s.active() || s.role != InputRole::kWeight) continue;
    if (s.reconstructed())
      return s.where() + " uses quantizer '" + s.quantizer_name + "', which learns by layer reconstruction";
    if (s.solved())
      return s.where() + " uses quantizer '" + s.quantizer_name + "', which solves the weight from the layer's inputs";
  }
  return {};
}

/// Every [w] and [a] table (top level and [[specific]]) against the backend's rules.
void check_backend_rules(const Config& config, const Backend& backend) {
  std::vector<std::tuple<std::string, const QuantTableConfig*, bool>> tables = {{"[w]", &config.w, true},
                                                                                {"[a]", &config.a, false}};
  for (const auto& e : config.specific) {
    tables.emplace_back(e.name + " w", &e.w, true);
    tables.emplace_back(e.name + " a", &e.a, false);
  }
  for (const auto& [table, cfg, is_weight] : tables) {
    if (cfg->disable) continue;
    if (auto why = backend_rules(backend, cfg->spec(is_weight, is_weight ? 0 : 1), is_weight ? "w" : "a")) {
      throw Error(config.source + ": " + table + " breaks the rules of backend '" + config.backend + "': " + *why);
    }
  }
}

/// The grids weights will be rounded on ([w] or the [[specific]] that matches), for passes
/// that choose weight transforms (awq): the weight input's quantized value, by its observer.
std::function<std::optional<PassContext::WeightGrid>(const Node&, std::size_t, std::int64_t)> weight_grids(
    const Config& config, const Registry& registry, const Model& model) {
  return [&config, &registry, &model](const Node& n, std::size_t input,
                                      std::int64_t channel_axis) -> std::optional<PassContext::WeightGrid> {
    if (node_matches_any(n.name, config.skip) || !n.has_input(input)) return std::nullopt;
    const QuantTableConfig* cfg = &config.w;
    for (const auto& e : config.specific)
      if (e.sets_w && node_matches_any(n.name, e.nodes)) {
        cfg = &e.w;
        break;
      }
    if (cfg->disable) return std::nullopt;
    const auto* obs = registry.observer(cfg->observer);
    if (!obs)
      throw Error(config.source + ": [w] observer '" + printable(cfg->observer) +
                  "' is not provided by any loaded plugin (available: " + join(registry.names("observer")) + ")");
    const auto w = model.graph.initializers.find(n.inputs[input]);
    if (w == model.graph.initializers.end()) return std::nullopt;
    if (channel_axis < 0) channel_axis += w->second.dim();
    const QSpec spec = cfg->spec(true, channel_axis);
    auto make = obs->factory;
    const Options* options = &cfg->observer_options;
    const std::string where = "input " + std::to_string(input) + " of " + n.describe();
    return PassContext::WeightGrid{spec, [spec, make, options, where](const at::Tensor& value) {
                                     auto observer = make(ObserverContext{spec, *options, where});
                                     c10::InferenceMode guard;
                                     observer->observe(value);
                                     return fake_quantize(value, observer->compute(), spec);
                                   }};
  };
}

/// Note [Choosing ranges by the consuming layer]: a calibration batch of `held` samples adds its
/// first samples to the choosing set until it holds `choose_on`, the next to the judging set
/// until it holds `judge_on`. A batch the Batcher stacked along dim 0 is cut; one it could not
/// cut (inputs not all stacked) goes whole to the set it starts.
void keep_range_samples(const detail::Feeds& feeds, std::int64_t held, std::int64_t choose_on, std::int64_t judge_on,
                        std::vector<detail::Feeds>& choose, std::int64_t& chosen, std::vector<detail::Feeds>& judge,
                        std::int64_t& judged) {
  const bool stacked = std::all_of(feeds.begin(), feeds.end(),
                                   [&](const auto& f) { return f.second.dim() > 0 && f.second.size(0) == held; });
  std::int64_t from = 0;
  for (auto [set, count, each] : {std::tuple{&choose, &chosen, choose_on}, std::tuple{&judge, &judged, judge_on}}) {
    if (*count >= each || from >= held) continue;
    const std::int64_t take = std::min(held - from, each - *count);
    if (!stacked) {
      set->push_back(feeds);
      *count += held;
      return;
    }
    detail::Feeds part;
    for (const auto& [name, t] : feeds) part[name] = take == held ? t : t.narrow(0, from, take);
    set->push_back(std::move(part));
    *count += take;
    from += take;
  }
}

}  // namespace

QuantModel::QuantModel(Model model, Config config, const Registry& registry, const DataSource& calibration)
    : model_(std::make_unique<Model>(std::move(model))), config_(std::move(config)), ops_(registry) {
  // Per-channel Q/DQ needs opset 13, and lifting later would move the inputs quantizers refer to.
  if (model_->graph.default_opset() < 13) {
    try {
      lift_opset(model_->graph, 13, ops_, static_value_facts(model_->graph, model_->meta.value_info));
    } catch (const Error& e) {
      throw Error(model_->meta.source_path + ": " + e.what());
    }
  }
  const auto* backend = registry.backend(config_.backend);
  if (!backend) {
    throw Error(config_.source + ": backend '" + printable(config_.backend) +
                "' is not provided by any loaded plugin (installed: " + join(registry.names("backend")) + ")");
  }
  backend_ = backend->factory();
  backend_plugin_ = backend->plugin;
  check_backend_rules(config_, *backend_);

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
  }
  // Simplify-stage passes rewrite the float graph before anything is bound to its nodes; those
  // that measure activations run the float model on the calibration device.
  const auto weight_grid = weight_grids(config_, registry, *model_);
  std::function<std::unique_ptr<Dataset>()> open_calibration;
  if (!calibration.empty())
    open_calibration = [calibration, inputs = model_->graph.inputs] { return calibration.open(inputs); };
  const std::vector<ScheduleEntry> schedule = resolve_schedule(config_, registry);
  run_passes(schedule, Pass::Stage::kSimplify, model_->graph, registry, nullptr, config_.source,
             PassData{open_calibration, config_.calibration.batch_size, config_.calibration.count, weight_grid,
                      config_.calibration.device});
  executor_ = std::make_unique<Executor>(model_->graph, registry);
  if (config_.calibration.device != "cpu") executor_->to(config_.calibration.device);

  const auto nodes = model_->graph.nodes();
  // A glob that matches nothing is almost always a typo or a model other than the one meant. The
  // first few are named; a config of thousands of them gets one line for the rest.
  constexpr std::size_t kNamedUnmatched = 10;
  std::size_t unmatched = 0;
  auto warn_unmatched = [&](const std::vector<std::string>& globs, const std::string& key) {
    for (const auto& glob : globs) {
      if (std::any_of(nodes.begin(), nodes.end(), [&](const Node* n) { return node_matches_any(n->name, {glob}); }))
        continue;
      if (++unmatched > kNamedUnmatched) continue;
      logs::warn("{}", config_.source + ": " + key + " glob '" + printable(glob, 80) + "' matches no node of " +
                           printable(model_->meta.source_path) + " (" + std::to_string(nodes.size()) + " nodes" +
                           (nodes.empty() ? std::string() : ", e.g. '" + printable(nodes.front()->name, 80) + "'") +
                           "); `sparsebit inspect --json` lists them");
    }
  };
  warn_unmatched(config_.skip, "skip");
  for (const auto& e : config_.specific) warn_unmatched(e.nodes, e.name + " nodes");
  if (unmatched > kNamedUnmatched)
    logs::warn("{}", config_.source + ": " + std::to_string(unmatched - kNamedUnmatched) +
                         " more globs match no node of " + printable(model_->meta.source_path));
  slots_ = std::make_unique<QuantSlots>(model_->graph, *executor_, config_, *backend_, backend_plugin_, registry);
  // A backend that weighs a layer's cost against its Q/DQ asks for sizes per sample: from one
  // calibration sample, else (no data yet, as from Python) from the declared shapes and ONNX's
  // shape inference, an open leading (batch) dimension taken as 1. Computed once, if asked.
  slots_->set_value_sizes([this, &registry, &calibration] {
    std::map<std::string, std::int64_t> sizes;
    const Graph& g = model_->graph;
    const ValueFacts facts = calibration.empty() ? static_value_facts(g, model_->meta.value_info)
                                                 : observed_value_facts(g, registry, sample_inputs(g, calibration));
    for (const auto& [name, fact] : facts) {
      if (fact.rank < 0 || static_cast<std::size_t>(fact.rank) != fact.dims.size()) continue;
      std::int64_t n = 1;
      for (std::size_t d = 0; d < fact.dims.size() && n >= 0; ++d)
        n = fact.dims[d] >= 0 ? n * fact.dims[d] : d == 0 ? n : -1;
      if (n >= 0) sizes[name] = n;
    }
    return sizes;
  });
  run_passes(schedule, Pass::Stage::kFuse, model_->graph, registry, &slots_->state(), config_.source);
  layer_passes_ = make_layer_passes(schedule, registry);
  try {
    backend_->place(slots_->state());
  } catch (const Error& e) {
    throw Error("backend '" + config_.backend + "' (plugin '" + backend_plugin_ + "'): " + e.what());
  }
  slots_->finish_building();
  std::size_t active = 0;
  for (const auto& s : slots()) active += s.active();
  logs::info("{}", std::to_string(nodes.size()) + " nodes, " + std::to_string(active) + " quantized inputs (" +
                       std::to_string(slots().size() - active) + " fused away)");
}

QuantModel::~QuantModel() = default;
QuantModel::QuantModel(QuantModel&&) noexcept = default;
QuantModel& QuantModel::operator=(QuantModel&&) noexcept = default;

std::size_t QuantModel::set_enabled(const std::string& node_glob, bool enabled, std::optional<InputRole> role) {
  auto found = slots_->matching(node_glob, role);
  for (QuantSlot* s : found) s->enabled = enabled;
  return found.size();
}

std::size_t QuantModel::set_bits(const std::string& node_glob, int bits, std::optional<InputRole> role) {
  return slots_->set_bits(node_glob, bits, role);
}

void QuantModel::set_quant(bool weights, bool activations) { slots_->set_quant(weights, activations); }

std::vector<at::Tensor> QuantModel::forward(const std::vector<at::Tensor>& inputs, const ValueFn& on_value) {
  const auto& gin = model_->graph.inputs;
  if (inputs.size() != gin.size()) {
    throw Error("the model has " + std::to_string(gin.size()) + " input(s), " + std::to_string(inputs.size()) +
                " given");
  }
  std::map<std::string, at::Tensor> feeds;
  for (std::size_t i = 0; i < gin.size(); ++i) feeds[gin[i].name] = inputs[i];
  if (!slots_->weights_on() && !slots_->activations_on() && !on_value) return executor_->run(feeds);
  return executor_->run(feeds, [this, &on_value](std::size_t n, std::size_t k, const at::Tensor& x) {
    if (on_value) on_value(executor_->flat_node(n).inputs[k], x);
    return slots_->apply(n, k, x);
  });
}

void QuantModel::set_slot_enabled(std::size_t slot, bool enabled) { slots_->all().at(slot).enabled = enabled; }

CalibrationStats QuantModel::calibrate(Dataset& data, const ProgressFn& progress) {
  slots_->reset_observers();
  if (config_.calibration.mode != "streaming") return run_layerwise(*this, data, progress);
  if (const std::string why = needs_layerwise(slots(), layer_passes_); !why.empty())
    throw Error(config_.source + ": " + why +
                "; set [calibration] mode = \"layerwise\" or \"asym\" (now \"streaming\")");

  // Inference mode only while data flows: quantizer parameters made afterwards must be
  // ordinary tensors that autograd (QAT) can train.
  std::optional<c10::InferenceMode> inference(std::in_place);
  const auto start = std::chrono::steady_clock::now();
  CalibrationStats stats;
  stats.mode = config_.calibration.mode;
  const auto& gin = model_->graph.inputs;
  Batcher batcher(data, gin, config_.calibration.batch_size, config_.calibration.count);
  const std::int64_t total =
      config_.calibration.count > 0 ? config_.calibration.count : data.num_samples().value_or(-1);
  const at::Device device(config_.calibration.device);
  // Weights are observed from the constants when the slots finish; only activations need the
  // data. Weight-only models skip the passes (and never page a mapped model in as a whole).
  const bool reads_data = std::any_of(slots().begin(), slots().end(), [](const QuantSlot& s) {
    return s.active() && s.role == InputRole::kActivation;
  });
  if (!reads_data) logs::info("{}", "only weights are quantized: the calibration data is not read");
  // Note [Distributed runs]: process r computes batches r, r + W, ...; observers merge below.
  Distributed* group = reads_data ? dividing_group(*slots_, false, false) : nullptr;
  std::int64_t index = -1;
  // Note [Choosing ranges by the consuming layer]: the first samples are kept for the range
  // selection, and as many after them to judge its choices at the output (Note [Choices judged
  // at the output]); they are few and bounded whatever the data's size. Every process reads the
  // batches that hold them (only their owner observes them), so that all choose on the samples
  // one process would.
  const std::int64_t choose_on = config_.calibration.range_samples, judge_on = 2 * choose_on;
  const std::int64_t keep_for_ranges = choose_on + judge_on;
  const std::int64_t batch_size = config_.calibration.batch_size;
  std::vector<detail::Feeds> range_batches, judge_batches;
  std::int64_t range_samples = 0, judge_samples = 0;
  auto mine = [group](std::int64_t i) { return !group || i % group->world_size() == group->rank(); };
  // Memory is independent of the sample count: one batch in flight (and two read ahead),
  // observers stream.
  std::optional<Prefetcher> ahead;
  if (reads_data)
    ahead.emplace(batcher, [mine, keep_for_ranges, batch_size](std::int64_t i) {
      return BatchShare{0, 1, !mine(i) && i * batch_size >= keep_for_ranges};
    });
  while (auto b = ahead ? ahead->next() : std::nullopt) {
    ++index;
    if (b->held == 0) {  // another process's batch
      stats.samples += b->rows;
      ++stats.batches;
      continue;
    }
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t i = 0; i < gin.size(); ++i) feeds[gin[i].name] = b->inputs[i].to(device);
    if (mine(index))
      executor_->run(feeds, [this](std::size_t n, std::size_t k, const at::Tensor& x) {
        slots_->observe(n, k, x);
        return x;
      });
    if (judge_samples < judge_on)
      keep_range_samples(feeds, b->held, choose_on, judge_on, range_batches, range_samples, judge_batches,
                         judge_samples);
    stats.samples += b->rows;
    ++stats.batches;
    if (progress) progress(stats.samples, total);
  }
  if (stats.samples == 0 && reads_data) throw Error("the calibration data " + data.describe() + " yielded no samples");
  inference.reset();
  if (group) {
    std::vector<QuantSlot*> all;
    for (auto& s : slots_->all()) all.push_back(&s);
    merge_observers(*group, all, device, "merging observer states");
  }
  const auto params_start = std::chrono::steady_clock::now();
  {
    c10::NoGradGuard no_grad;
    slots_->finish_all();
  }
  stats.parameter_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - params_start).count();
  if (!range_batches.empty()) {
    const auto chosen =
        detail::select_ranges(*executor_, *slots_, range_batches, range_samples, &judge_batches, judge_samples, group);
    range_batches.clear();
    judge_batches.clear();
    stats.range_selected_inputs = chosen.inputs;
    stats.range_selection_samples = chosen.samples;
    stats.range_selection_seconds = chosen.seconds;
    stats.range_choices = chosen.chosen;
    stats.range_judged_samples = chosen.judged_samples;
    stats.range_departures = chosen.departures;
    stats.range_kept_departures = chosen.kept;
    stats.range_output_error_default = chosen.output_error_default;
    stats.range_output_error_kept = chosen.output_error_kept;
  }
  slots_->tie_grids();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

void QuantModel::set_constant_input(std::size_t node, std::size_t input, const at::Tensor& value) {
  Graph& g = model_->graph;
  if (node >= g.num_nodes())
    throw Error(executor_->flat_node(node).describe() + ": constants inside control-flow bodies stay as they are");
  Node& n = g.node(node);
  if (!n.has_input(input) || !g.initializers.count(n.inputs[input]))
    throw Error(n.describe() + ": input " + std::to_string(input) + " is not a constant");
  const std::string name = n.inputs[input];
  const at::Tensor& old = g.initializers.at(name);
  if (value.sizes() != old.sizes()) {
    throw Error(n.describe() + ": new value of '" + name + "' has shape " + c10::str(value.sizes()) +
                ", the constant has " + c10::str(old.sizes()));
  }
  const at::Tensor cpu = value.detach().to(at::kCPU, old.scalar_type()).contiguous();
  const at::Tensor on_device = value.detach().to(executor_->constants().at(name).device(), old.scalar_type());
  std::size_t readers = 0;
  for (const Node* other : g.nodes())
    readers += static_cast<std::size_t>(std::count(other->inputs.begin(), other->inputs.end(), name));
  if (readers == 1) {
    g.initializers[name] = cpu;
    executor_->set_constant(name, on_device);
    return;
  }
  // Shared with other nodes: this node gets its own copy.
  const std::string own = g.unique_name(name + "_" + n.name + "_corrected");
  g.initializers[own] = cpu;
  executor_->add_constant(own, on_device);
  n.inputs[input] = own;
  if (QuantSlot* s = slots_->at(node, input)) s->tensor = own;
}

Graph QuantModel::export_graph() const {
  release_free_memory();  // calibration's cached activations: export allocates other sizes
  Graph g = export_qdq(QdqExportInput{model_->graph, model_->meta, *executor_, *slots_, *backend_, config_.backend,
                                      backend_plugin_, trainable_, named_states(), ops_});
  if (config_.export_options.weight_format == "matmul_nbits") {
    const std::size_t n = to_matmul_nbits(g, config_.export_options.accuracy_level);
    if (n == 0)
      logs::warn("{}",
                 config_.source +
                     ": [export] weight_format = \"matmul_nbits\" found no MatMul or Gemm with per-group 4- or 8-bit "
                     "weights in blocks of a power of two >= 16 along K; every weight keeps DequantizeLinear");
    else logs::info("{}", "wrote " + std::to_string(n) + " layers as com.microsoft.MatMulNBits");
  }
  return g;
}

std::string QuantModel::serialize(std::string* external, const std::string& external_location,
                                  bool force_external) const {
  ExportOptions options;
  options.metadata_props = qdq_metadata(*slots_);
  options.external_data = force_external;
  return serialize_onnx(export_graph(), model_->meta, options, external, external_location);
}

void QuantModel::export_onnx(const std::string& path) const {
  ExportOptions options;
  options.metadata_props = qdq_metadata(*slots_);
  save_onnx(export_graph(), model_->meta, path, options);
}

}  // namespace sparsebit
