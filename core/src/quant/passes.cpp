#include "sparsebit/core/passes.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "base/log.h"
#include "base/mapped_file.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op.h"

namespace sparsebit {
namespace {

/// `x` with channel axis `axis` (negative from the end) as the columns of a 2-D [rows, C] view;
/// undefined for values statistics cannot describe.
at::Tensor channel_rows(const std::string& name, const at::Tensor& x, std::int64_t axis) {
  if (!x.defined() || x.is_nested() || !x.is_floating_point()) return {};
  const std::int64_t given = axis;
  if (axis < 0) axis += x.dim();
  if (axis < 0 || axis >= x.dim())
    throw Error("channel statistics: axis " + std::to_string(given) + " is outside the " + std::to_string(x.dim()) +
                "-D value '" + name + "'");
  return x.detach().movedim(axis, -1).reshape({-1, x.size(axis)});
}

/// One float run of `graph` over the samples; `take(i, name, rows)` sees, per batch, each
/// requested value once per request i as channel rows [n, C] (values statistics cannot describe
/// are left out).
void scan_requests(const Graph& graph, const Registry& registry, const PassData& data,
                   const std::vector<PassContext::ChannelRequest>& requests,
                   const std::function<void(std::size_t, const std::string&, const at::Tensor&)>& take) {
  c10::InferenceMode guard;
  std::map<std::string, std::vector<std::size_t>> wanted;
  for (std::size_t i = 0; i < requests.size(); ++i) wanted[requests[i].first].push_back(i);
  Executor executor(graph, registry);
  const at::Device device(data.device);
  if (!device.is_cpu()) executor.to(data.device);
  auto samples = data.open();
  Batcher batcher(*samples, graph.inputs, data.batch_size, data.count);
  std::int64_t seen = 0;
  while (auto b = batcher.next()) {
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t k = 0; k < b->inputs.size(); ++k) feeds[graph.inputs[k].name] = b->inputs[k].to(device);
    std::set<std::string> done;  // a value read by several nodes is reduced once per batch
    executor.run(feeds, [&](std::size_t n, std::size_t k, const at::Tensor& x) {
      const std::string& name = executor.flat_node(n).inputs[k];
      auto it = wanted.find(name);
      if (it == wanted.end() || !done.insert(name).second) return x;
      for (auto i : it->second)
        if (const at::Tensor rows = channel_rows(name, x, requests[i].second); rows.defined()) take(i, name, rows);
      return x;
    });
    seen += b->rows;
  }
  if (seen == 0) throw Error("channel statistics: " + samples->describe() + " yielded no samples");
  for (const auto& [name, t] : graph.initializers) page_out(t);  // Note [Mapped weights]: the run read them all
}

void same_channels(const at::Tensor& before, const at::Tensor& now, const std::string& name) {
  if (before.defined() && before.sizes() != now.sizes())
    throw Error("channel statistics: value '" + name + "' changes its channel count between samples");
}

/// PassContext::channel_absmax: each requested value reduced to its per-channel largest
/// magnitude as it goes by.
std::vector<at::Tensor> channel_absmax(const Graph& graph, const Registry& registry, const PassData& data,
                                       const std::vector<PassContext::ChannelRequest>& requests) {
  std::vector<at::Tensor> result(requests.size());
  scan_requests(graph, registry, data, requests, [&](std::size_t i, const std::string& name, const at::Tensor& rows) {
    const at::Tensor m = rows.abs().amax(0).to(at::kFloat);
    same_channels(result[i], m, name);
    result[i] = result[i].defined() ? at::maximum(result[i], m) : m;
  });
  for (auto& r : result)
    if (r.defined()) r = r.cpu();
  return result;
}

/// PassContext::channel_moments: sums of |x| and of x x^T per requested value, divided by the
/// row count at the end.
std::vector<PassContext::ChannelMoments> channel_moments(const Graph& graph, const Registry& registry,
                                                         const PassData& data,
                                                         const std::vector<PassContext::ChannelRequest>& requests) {
  std::vector<PassContext::ChannelMoments> result(requests.size());
  scan_requests(graph, registry, data, requests, [&](std::size_t i, const std::string& name, const at::Tensor& rows) {
    const at::Tensor r = rows.to(at::kFloat);
    auto& m = result[i];
    same_channels(m.mean_abs, r.select(0, 0), name);
    if (!m.gram.defined()) {
      m.mean_abs = at::zeros({r.size(1)}, r.options());
      m.gram = at::zeros({r.size(1), r.size(1)}, r.options());
    }
    m.mean_abs.add_(r.abs().sum(0));
    m.gram.addmm_(r.t(), r);
    m.rows += r.size(0);
  });
  c10::InferenceMode guard;
  for (auto& m : result) {
    if (m.rows == 0) continue;
    m.mean_abs.div_(static_cast<double>(m.rows));
    m.gram.div_(static_cast<double>(m.rows));
  }
  return result;
}

/// The pipeline's own steps that [schedule] switches like passes (Note [Pass schedule]).
const std::vector<std::string>& host_steps() {
  static const std::vector<std::string> steps{"bn_tuning"};
  return steps;
}

bool contains(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

/// Refuses `name` (from `key` of the config) unless a loaded plugin registers it as a pass.
void check_registered(const std::string& name, const std::string& key, const Config& config, const Registry& registry,
                      const std::vector<std::string>& known) {
  if (contains(known, name)) return;
  const std::string hint = nearest(name, known);
  std::string off;
  for (const auto& p : registry.plugins())
    if (p.status != PluginRecord::Status::kLoaded)
      off += (off.empty() ? "" : ", ") + (p.name.empty() ? p.file : p.name);
  throw Error(config.source + ": " + key + ": no loaded plugin registers a pass '" + printable(name, 80) + "'" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + (off.empty() ? "" : "; not loaded: " + off) +
              "; `sparsebit plugins` lists the passes");
}

}  // namespace

std::vector<ScheduleEntry> resolve_schedule(const Config& config, const Registry& registry) {
  const PassSettings& settings = config.passes;
  const std::vector<std::string> registered = registry.names("pass");
  std::vector<std::string> known = registered;
  known.insert(known.end(), host_steps().begin(), host_steps().end());

  // Placed passes by (order, name), then the others by name (names() is sorted).
  std::vector<std::pair<std::tuple<bool, int, std::string>, ScheduleEntry>> ranked;
  for (const auto& name : registered) {
    const PassSchedule* place = registry.pass_schedule(name);
    const bool on =
        place && place->on_by_default && (place->backends.empty() || contains(place->backends, config.backend));
    ranked.push_back({{place == nullptr, place ? place->order : 0, name}, ScheduleEntry{name, on}});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ScheduleEntry> schedule;
  for (auto& [rank, entry] : ranked) schedule.push_back(std::move(entry));
  auto find = [&](const std::string& name) {
    return std::find_if(schedule.begin(), schedule.end(), [&](const ScheduleEntry& e) { return e.pass == name; });
  };

  for (const auto& name : settings.extra) {
    check_registered(name, "[passes] extra", config, registry, registered);
    if (registry.pass_schedule(name))
      throw Error(config.source + ": [passes] extra: '" + name +
                  "' is already scheduled by its plugin; turn it on in [schedule]");
    find(name)->enabled = true;
  }
  for (const auto& [name, on] : settings.switches) {
    if (contains(host_steps(), name)) continue;
    check_registered(name, "[schedule] " + printable(name, 80), config, registry, known);
    find(name)->enabled = on;
  }
  std::vector<ScheduleEntry> ordered;
  for (const auto& name : settings.order) {
    check_registered(name, "[passes] order", config, registry, registered);
    auto it = find(name);
    if (it == schedule.end()) throw Error(config.source + ": [passes] order names '" + name + "' twice");
    ordered.push_back(std::move(*it));
    schedule.erase(it);
  }
  ordered.insert(ordered.end(), std::make_move_iterator(schedule.begin()), std::make_move_iterator(schedule.end()));
  for (const auto& [name, options] : settings.options) {
    check_registered(name, "[passes." + printable(name, 80) + "]", config, registry, known);
    for (auto& e : ordered)
      if (e.pass == name) e.options = options;
  }
  for (const auto& p : registry.plugins())
    if (p.status == PluginRecord::Status::kDisabled)
      logs::info("{}", "plugin " + (p.name.empty() ? p.file : p.name) + " is disabled (" + p.reason +
                           "): the passes it registers are not in the schedule");
  return ordered;
}

bool run_passes(const std::vector<ScheduleEntry>& schedule, Pass::Stage stage, Graph& graph, const Registry& registry,
                QuantState* state, const std::string& config_source, const PassData& data) {
  bool any = false;
  for (const auto& entry : schedule) {
    if (!entry.enabled) continue;
    const auto* p = registry.pass(entry.pass);
    if (!p) {
      throw Error(config_source + ": [schedule] " + entry.pass + " is on, but no loaded plugin provides pass '" +
                  entry.pass + "' (set it to false or install the plugin; `sparsebit plugins` lists passes)");
    }
    PassContext ctx{entry.options};
    ctx.evaluate = [&registry, &graph](const Node& n, const std::vector<at::Tensor>& inputs) {
      const auto* op = registry.op(n.op_type, n.domain);
      if (!op) throw Error("no QModule for op " + n.op_type);
      auto it = graph.opset_imports.find(n.domain);
      auto module = op->factory(OpContext{n, it == graph.opset_imports.end() ? 0 : it->second, graph});
      c10::InferenceMode guard;
      try {
        return module->forward(inputs);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        throw Error(n.describe() + ": " + e.what());
      }
    };
    if (stage == Pass::Stage::kSimplify && data.open) {
      ctx.channel_absmax = [&registry, &graph, &data](const std::vector<PassContext::ChannelRequest>& requests) {
        return channel_absmax(graph, registry, data, requests);
      };
      ctx.channel_moments = [&registry, &graph, &data](const std::vector<PassContext::ChannelRequest>& requests) {
        return channel_moments(graph, registry, data, requests);
      };
    }
    if (stage == Pass::Stage::kSimplify) ctx.weight_grid = data.weight_grid;
    // release_initializer (pass.h) from the pass: Note [Spilled weights]. Only weights worth a
    // file move there; small constants stay in the heap.
    const ReleaseHandler release([](Graph& g, const std::string& name) {
      auto it = g.initializers.find(name);
      if (it == g.initializers.end()) return;
      constexpr std::int64_t kSpillBytes = std::int64_t{1} << 20;
      if (!is_mapped(it->second) && it->second.device().is_cpu() && it->second.nbytes() >= kSpillBytes)
        it->second = spill(it->second);
      page_out(it->second);
    });
    try {
      auto pass = p->factory();
      if (pass->stage() != stage) continue;
      const bool changed = stage == Pass::Stage::kFuse ? pass->run_quant(*state, ctx) : pass->run(graph, ctx);
      if (changed) logs::debug("{}", "pass '" + entry.pass + "' changed the model");
      any = any || changed;
      if (stage == Pass::Stage::kSimplify) graph.validate();
      auto unused = entry.options.unused();
      if (!unused.empty()) {
        throw Error(config_source + ": [passes." + entry.pass + "] key " + unused.front() +
                    " is not read by this pass");
      }
    } catch (const Error& e) {
      throw Error("pass '" + entry.pass + "' (plugin '" + p->plugin + "'): " + e.what());
    } catch (const std::exception& e) {
      throw Error("pass '" + entry.pass + "' (plugin '" + p->plugin + "') failed: " + e.what());
    }
  }
  return any;
}

std::vector<LayerPass> make_layer_passes(const std::vector<ScheduleEntry>& schedule, const Registry& registry) {
  std::vector<LayerPass> made;
  for (const auto& entry : schedule) {
    if (!entry.enabled) continue;
    const auto* p = registry.pass(entry.pass);
    if (!p) continue;  // reported by run_passes, which runs first
    std::unique_ptr<Pass> pass;
    try {
      pass = p->factory();
    } catch (const std::exception& e) {
      throw Error("pass '" + entry.pass + "' (plugin '" + p->plugin + "') failed to construct: " + e.what());
    }
    if (pass->stage() != Pass::Stage::kLayer) continue;
    made.push_back({entry.pass, p->plugin, entry.options, std::move(pass)});
  }
  return made;
}

bool run_simplify_pass(const std::string& name, Graph& graph, const Registry& registry) {
  return run_passes({{name, true}}, Pass::Stage::kSimplify, graph, registry, nullptr, "run_simplify_pass");
}

}  // namespace sparsebit
