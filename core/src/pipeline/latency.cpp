// Note [Latency step]
// A quantized model is for deployment, so `quantize` ends by timing what it wrote in the runtime
// its backend targets: the float model and the export, in ONNX Runtime's CPU provider with its
// graph optimizations (as deployed), on the first calibration sample, at each of `[latency]
// threads` (1 and every core by default), median of `runs` runs after warm-up, both sessions
// interleaved run by run in one process so that machine noise hits both alike. The report and the
// console give both times and their ratio; where the export is slower, the run warns and says
// what it gains instead (size).
//
// ONNX Runtime is reached through the npm package onnxruntime-node (the library and its binding,
// which the project already installs for its tests) by a helper script run with `node`
// (ort_timing.mjs, installed beside the plugin folder): a crash or a hang of the runtime on an
// odd model stays in that process, which is given a time limit, and nothing is linked. The
// package folder is `[latency] runtime`, else $SPARSEBIT_ONNXRUNTIME_NODE, else
// onnxruntime-node beside the plugin folder, else the source tree's tests/ort copy (a build tree).
// `enabled = "auto"` (the default) times where node and the package are found and otherwise says
// that the export was not timed; `true` makes their absence an error.
//
// Note [Latency search]
// A static placement (Note [ONNX Runtime placement]) estimates what Q/DQ cost against what the
// integer kernels save; the processor decides. After calibration (and the accuracy target),
// `quantize` times candidates as TensorRT Model Optimizer's autotune does. The quantized layers
// of the main graph fall into regions: each quantized node is joined to the producer of every
// quantized tensor it reads (past a Relu or another op of one input and no quantizer, which the
// Q makes redundant) where that producer computes on integers (every variable input quantized,
// and weights or two such inputs), since its integer kernel needs the Q the reader's quantizer
// makes. Switching a whole region off thus leaves no integer layer without its Q and no Q
// without its reader, whatever the other regions do. Up to `[latency] regions` regions, those
// with the fewest weights first (where Q/DQ weigh most against the integer work), are each
// timed left float, all in one ONNX Runtime process with the float model and the export as
// placed, round-robin, `runs` rounds per thread count. A region goes float where it ran faster
// so in at least 3/4 of the rounds and by more than 1% (medians) at some thread count, and not
// slower by its median at any: a region that noise cannot tell apart stays as placed. The
// regions chosen are then timed together against the export as placed and kept float only if
// that holds again (one at a time is not all at once). A model whose every region runs faster in
// float keeps its placement: quantizing cannot speed it up, and the latency step says so. With
// an accuracy target the target runs first; the report's `kept_float` names what kept each
// float layer float ("accuracy" or "latency").

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "pipeline/pipeline_steps.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/quant_slots.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace {

namespace fs = std::filesystem;

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool is_runtime(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "dist" / "index.js", ec);
}

/// The onnxruntime-node folder, or "" (with `tried` listing where it looked).
std::string find_runtime(const LatencyConfig& config, std::string& tried) {
  std::vector<std::string> candidates;
  if (!config.runtime.empty()) candidates.push_back(config.runtime);
  if (const char* env = std::getenv("SPARSEBIT_ONNXRUNTIME_NODE"); env && *env) candidates.emplace_back(env);
  if (const std::string plugins = Registry::default_plugin_folder(); !plugins.empty())
    candidates.push_back((fs::path(plugins).parent_path() / "onnxruntime-node").string());
  candidates.emplace_back(SPARSEBIT_ORT_NODE_HINT);
  for (const auto& c : candidates) {
    if (is_runtime(c)) return c;
    tried += (tried.empty() ? "" : ", ") + c;
    if (!config.runtime.empty() && c == config.runtime) break;  // the config's choice, or nothing
  }
  return {};
}

bool have_node() { return std::system("node --version > /dev/null 2>&1") == 0; }

std::int64_t file_bytes(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<std::int64_t>(n);
}

/// Where ONNX Runtime and the helper are, or why they cannot be used.
struct Runtime {
  std::string folder, helper, why_not;
};

Runtime find_timer(const LatencyConfig& config) {
  Runtime t;
  std::string tried;
  t.folder = find_runtime(config, tried);
  t.helper = (fs::path(Registry::default_plugin_folder()).parent_path() / "ort_timing.mjs").string();
  std::error_code ec;
  if (t.folder.empty()) {
    t.why_not = "ONNX Runtime (the npm package onnxruntime-node) not found (looked in " + tried +
                "); set [latency] runtime to its folder";
  } else if (!fs::is_regular_file(t.helper, ec)) {
    t.why_not = "the timing helper " + t.helper + " is missing (reinstall Sparsebit)";
  } else if (!have_node()) {
    t.why_not = "`node` (Node.js) is not on PATH; ONNX Runtime runs through it";
  }
  return t;
}

/// A fresh temporary folder, removed with everything in it when this goes.
class Scratch {
 public:
  Scratch() {
    static int made = 0;
    dir_ =
        fs::temp_directory_path() / ("sparsebit_latency_" + std::to_string(::getpid()) + "_" + std::to_string(made++));
    fs::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  /// Writes `bytes` to a file of this folder and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string path = file(name);
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw Error("[latency]: could not write a temporary model to " + path);
    return path;
  }

 private:
  fs::path dir_;
};

/// Drops messages below errors while it lives: the candidates' exports would repeat what the
/// export itself says.
class QuietLogs {
 public:
  QuietLogs() : was_(spdlog::get_level()) { spdlog::set_level(std::max(was_, spdlog::level::err)); }
  ~QuietLogs() { spdlog::set_level(was_); }
  QuietLogs(const QuietLogs&) = delete;
  QuietLogs& operator=(const QuietLogs&) = delete;

 private:
  spdlog::level::level_enum was_;
};

/// One thread count's times: the median per model and the rounds each beat the second model.
struct ThreadTimes {
  std::int64_t threads = 0;
  std::vector<double> ms;
  std::vector<std::int64_t> beats_second;
};

/// Times `models` in ONNX Runtime through the helper on the first sample of `calib`; empty with
/// `failure` set where the runtime could not.
std::vector<ThreadTimes> time_models(const LatencyConfig& config, const Runtime& runtime,
                                     const std::vector<std::string>& models, const Graph& graph,
                                     const DataSource& calib, std::string& failure) {
  Scratch scratch;
  const std::vector<at::Tensor> sample = sample_inputs(graph, calib);
  std::string command = "SPARSEBIT_PARENT_PID=" + std::to_string(::getpid()) + " timeout 1800 node " +
                        shell_quoted(runtime.helper) + " " + shell_quoted(runtime.folder) + " " +
                        std::to_string(config.runs) + " ";
  const std::int64_t cores = std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  std::string threads;
  for (std::int64_t t : config.threads) threads += (threads.empty() ? "" : ",") + std::to_string(t == 0 ? cores : t);
  command += threads;
  for (const auto& m : models) command += " " + shell_quoted(m);
  command += " --";
  for (std::size_t i = 0; i < sample.size() && i < graph.inputs.size(); ++i) {
    const std::string file = scratch.file("input" + std::to_string(i) + ".npy");
    write_npy(sample[i], file);
    command += " " + shell_quoted(graph.inputs[i].name + "=" + file);
  }
  command += " 2>&1";
  std::string output;
  FILE* p = popen(command.c_str(), "r");
  if (!p) throw Error("[latency]: could not start node");
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) output += buf;
  const int status = pclose(p);
  std::vector<ThreadTimes> rows;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("threads") || !j.contains("ms")) continue;
    ThreadTimes row;
    row.threads = j.value("threads", std::int64_t{0});
    row.ms = j.at("ms").get<std::vector<double>>();
    row.beats_second = j.at("beats_second").get<std::vector<std::int64_t>>();
    if (row.ms.size() != models.size() || row.beats_second.size() != models.size()) continue;
    rows.push_back(std::move(row));
  }
  if (status != 0 || rows.size() != config.threads.size()) {
    failure = output.size() > 600 ? output.substr(output.size() - 600) : output;
    rows.clear();
  }
  return rows;
}

}  // namespace

LatencyReport measure_latency(const LatencyConfig& config, const std::string& float_model,
                              const std::string& export_model, const Graph& graph, const DataSource& calib) {
  LatencyReport r;
  r.float_bytes = file_bytes(float_model);
  r.export_bytes = file_bytes(export_model);
  if (config.enabled == "off") {
    r.why_not = "[latency] enabled = false";
    return r;
  }
  const Runtime runtime = find_timer(config);
  r.runtime = runtime.folder;
  r.why_not = runtime.why_not;
  if (!r.why_not.empty()) {
    if (config.enabled == "on") throw Error("[latency] enabled = true, but " + r.why_not);
    return r;
  }
  std::string failure;
  for (const auto& row : time_models(config, runtime, {float_model, export_model}, graph, calib, failure))
    r.rows.push_back({row.threads, row.ms[0], row.ms[1]});
  if (r.rows.empty()) {
    r.why_not = "ONNX Runtime could not time the models (" + failure + ")";
    if (config.enabled == "on") throw Error("[latency] " + r.why_not);
    return r;
  }
  r.measured = true;
  return r;
}

namespace steps {

namespace {
// Note [Latency search]: a region goes float where it ran faster so in at least this share of
// the rounds and by more than this margin at some thread count, and slower at none.
constexpr double kDecisiveShare = 0.75;
constexpr double kMargin = 0.01;
constexpr std::int64_t kSearchRuns = 8;
}  // namespace

LatencyReport time_export(const Config& config, const std::string& float_model, const std::string& bytes,
                          const std::string& external, const Graph& graph, const DataSource& calib) {
  LatencyReport r;
  if (config.latency.enabled == "auto" && config.backend != "onnxruntime") {
    r.why_not = "backend '" + config.backend + "' deploys elsewhere: ONNX Runtime's times would not tell its speed";
    return r;
  }
  if (!external.empty()) {
    r.why_not = "the export keeps its weights in an external file; time it in ONNX Runtime where it is written";
    if (config.latency.enabled == "on") throw Error("[latency] enabled = true, but " + r.why_not);
    return r;
  }
  Scratch scratch;
  return measure_latency(config.latency, float_model, scratch.write("export.onnx", bytes), graph, calib);
}

std::vector<std::vector<std::size_t>> quantized_regions(const QuantModel& qm) {
  const Graph& g = qm.graph();
  const std::size_t count = g.num_nodes();
  const QuantSlots& slots = qm.quant_slots();
  std::vector<bool> active(count, false), weighted(count, false);
  std::vector<std::size_t> activations(count, 0);
  for (const QuantSlot& s : slots.all()) {
    if (s.node_index >= count || !slots.usable(s)) continue;
    active[s.node_index] = true;
    if (s.role == InputRole::kWeight) weighted[s.node_index] = true;
    if (!g.initializers.count(s.tensor)) ++activations[s.node_index];
  }
  std::map<std::string, std::size_t> producer;
  for (std::size_t i = 0; i < count; ++i)
    for (const auto& o : g.node(i).outputs)
      if (!o.empty()) producer[o] = i;
  auto variable_inputs = [&](const Node& n) {
    std::vector<std::string> out;
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (n.has_input(k) && !g.initializers.count(n.inputs[k])) out.push_back(n.inputs[k]);
    return out;
  };
  // A layer that computes on integers: every variable input quantized, and weights or several
  // quantized inputs (an op of one input, a Tanh or a MaxPool, runs as well in float).
  auto computes = [&](std::size_t i) {
    if (!active[i] || (!weighted[i] && activations[i] < 2)) return false;
    return activations[i] >= variable_inputs(g.node(i)).size();
  };
  std::vector<std::size_t> root(count);
  for (std::size_t i = 0; i < count; ++i) root[i] = i;
  auto find = [&](std::size_t i) {
    while (root[i] != i) i = root[i] = root[root[i]];
    return i;
  };
  for (const QuantSlot& s : slots.all()) {
    if (s.node_index >= count || !slots.usable(s) || g.initializers.count(s.tensor)) continue;
    // The producer, past ops of one variable input and no quantizer (a Relu its Q makes redundant).
    auto p = producer.find(s.tensor);
    for (int hops = 0; hops < 4 && p != producer.end() && !active[p->second]; ++hops) {
      const auto in = variable_inputs(g.node(p->second));
      if (in.size() != 1) break;
      p = producer.find(in[0]);
    }
    if (p != producer.end() && computes(p->second)) root[find(s.node_index)] = find(p->second);
  }
  std::map<std::size_t, std::vector<std::size_t>> by_root;
  for (std::size_t i = 0; i < count; ++i)
    if (active[i]) by_root[find(i)].push_back(i);
  std::vector<std::vector<std::size_t>> regions;
  for (auto& [r, nodes] : by_root) regions.push_back(std::move(nodes));
  std::sort(regions.begin(), regions.end());
  return regions;
}

/// Whether model `k` ran faster than the second (the export as placed): in at least 3/4 of the
/// rounds and by more than the margin at some thread count, and not slower by its median at any.
bool runs_faster(const std::vector<ThreadTimes>& times, std::size_t k, std::int64_t runs) {
  const auto decisive = static_cast<std::int64_t>(std::ceil(kDecisiveShare * static_cast<double>(runs)));
  bool faster = false, slower = false;
  for (const ThreadTimes& t : times) {
    const double speedup = t.ms[1] / t.ms[k];
    faster = faster || (t.beats_second[k] >= decisive && speedup > 1 + kMargin);
    slower = slower || speedup < 1 - kMargin;
  }
  return faster && !slower;
}

LatencySearch search_latency(QuantModel& qm, const Config& config, const std::string& float_model,
                             const DataSource& calib) {
  const auto start = std::chrono::steady_clock::now();
  const LatencyConfig& lc = config.latency;
  LatencySearch r;
  r.runs = lc.runs;
  const std::vector<std::vector<std::size_t>> regions = quantized_regions(qm);
  r.regions = regions.size();
  const Runtime runtime = find_timer(lc);
  if (regions.size() < 2) {
    r.why_not = regions.empty() ? "no layer of the main graph is quantized; control-flow bodies are not searched"
                                : "the quantized layers form one region";
  } else if (lc.runs < kSearchRuns) {
    r.why_not = "[latency] runs = " + std::to_string(lc.runs) + ": fewer than " + std::to_string(kSearchRuns) +
                " rounds cannot tell a region's time from noise";
  } else if (!runtime.why_not.empty()) {
    r.why_not = runtime.why_not;
  }
  if (!r.why_not.empty()) return r;

  const Graph& g = qm.graph();
  // The regions with the least weight first: where Q/DQ weigh most against the integer work.
  std::vector<std::pair<std::int64_t, std::size_t>> order;
  for (std::size_t k = 0; k < regions.size(); ++k) {
    std::int64_t weight = 0;
    for (const QuantSlot& s : qm.slots())
      if (s.role == InputRole::kWeight && g.initializers.count(s.tensor) &&
          std::binary_search(regions[k].begin(), regions[k].end(), s.node_index))
        weight += g.initializers.at(s.tensor).numel();
    order.emplace_back(weight, k);
  }
  std::stable_sort(order.begin(), order.end());
  order.resize(std::min<std::size_t>(order.size(), static_cast<std::size_t>(lc.regions)));

  // The slots each region switches off as float (those in use now).
  auto region_slots = [&](std::size_t k) {
    std::vector<std::size_t> out;
    const auto& all = qm.slots();
    for (std::size_t i = 0; i < all.size(); ++i)
      if (all[i].enabled && std::binary_search(regions[k].begin(), regions[k].end(), all[i].node_index))
        out.push_back(i);
    return out;
  };
  auto set = [&](const std::vector<std::size_t>& which, bool on) {
    for (std::size_t i : which) qm.set_slot_enabled(i, on);
  };
  Scratch scratch;
  std::vector<std::string> models = {float_model};
  {
    QuietLogs quiet;
    std::string external;
    models.push_back(scratch.write("export.onnx", qm.serialize(&external)));
    if (!external.empty()) {
      r.why_not = "the export keeps its weights in an external file";
      return r;
    }
    for (const auto& [weight, k] : order) {
      const auto off = region_slots(k);
      set(off, false);
      try {
        models.push_back(scratch.write("region" + std::to_string(k) + ".onnx", qm.serialize()));
      } catch (...) {
        set(off, true);
        throw;
      }
      set(off, true);
    }
  }
  spdlog::info("latency search: timing {} of {} quantized regions as float in ONNX Runtime", order.size(),
               regions.size());
  std::string failure;
  const std::vector<ThreadTimes> times = time_models(lc, runtime, models, g, calib, failure);
  if (times.empty()) {
    r.why_not = "ONNX Runtime could not time the models (" + failure + ")";
    return r;
  }
  r.ran = true;
  for (const ThreadTimes& t : times) r.threads.push_back(t.threads);
  std::vector<std::size_t> chosen;
  for (std::size_t c = 0; c < order.size(); ++c) {
    LatencySearch::Region region;
    for (std::size_t n : regions[order[c].second]) region.nodes.push_back(g.node(n).name);
    for (const ThreadTimes& t : times) {
      region.speedup_as_float.push_back(t.ms[1] / t.ms[c + 2]);
      region.rounds_faster_as_float.push_back(t.beats_second[c + 2]);
    }
    region.made_float = runs_faster(times, c + 2, lc.runs);
    if (region.made_float) chosen.push_back(c);
    r.timed.push_back(std::move(region));
  }
  // A model of which every region runs faster in float is one quantizing cannot speed up: it
  // keeps its static placement, and the latency step says what the export gains instead.
  if (chosen.size() == regions.size()) chosen.clear();
  std::vector<std::size_t> switched;  // the slots the chosen regions switch off
  for (std::size_t c : chosen) {
    const auto off = region_slots(order[c].second);
    switched.insert(switched.end(), off.begin(), off.end());
  }
  set(switched, false);
  if (!chosen.empty()) {
    // The regions were timed one at a time: the choice stands only if, all together, it runs faster.
    std::vector<std::string> both = {float_model, models[1]};
    {
      QuietLogs quiet;
      both.push_back(scratch.write("chosen.onnx", qm.serialize()));
    }
    const std::vector<ThreadTimes> check = time_models(lc, runtime, both, g, calib, failure);
    for (const ThreadTimes& t : check) r.speedup_together.push_back(t.ms[1] / t.ms[2]);
    if (check.empty() || !runs_faster(check, 2, lc.runs)) {
      set(switched, true);
      chosen.clear();
      r.reverted = true;
    }
  }
  for (auto& region : r.timed) region.made_float = region.made_float && !chosen.empty();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

void log_latency_search(const LatencySearch& r) {
  if (!r.ran) {
    spdlog::info("latency search: not run ({})", r.why_not);
    return;
  }
  std::size_t made = 0;
  for (const auto& region : r.timed) {
    if (!region.made_float) continue;
    ++made;
    std::string speed;
    for (std::size_t t = 0; t < region.speedup_as_float.size(); ++t)
      speed += (speed.empty() ? "" : ", ") + fmt::format("{:.3f}x at {} thread{}", region.speedup_as_float[t],
                                                         r.threads[t], r.threads[t] == 1 ? "" : "s");
    spdlog::info("latency search: {} node{} from '{}' left float, faster so in ONNX Runtime ({})", region.nodes.size(),
                 region.nodes.size() == 1 ? "" : "s", region.nodes.front(), speed);
  }
  if (r.reverted)
    spdlog::info(
        "latency search: the regions that ran faster as float one at a time did not together; all stay "
        "quantized");
  spdlog::info("latency search: {} of {} quantized regions timed as float in {:.1f} s, {} left float", r.timed.size(),
               r.regions, r.seconds, made);
}

void log_latency(const LatencyReport& r) {
  if (!r.measured) {
    spdlog::info("latency: not measured ({}); the placement is the backend's static one", r.why_not);
    return;
  }
  std::string slower;
  for (const auto& row : r.rows) {
    spdlog::info("latency in ONNX Runtime, {} thread{}: float {:.2f} ms, export {:.2f} ms ({:.2f}x)", row.threads,
                 row.threads == 1 ? "" : "s", row.float_ms, row.export_ms, row.float_ms / row.export_ms);
    if (row.export_ms > row.float_ms)
      slower += (slower.empty() ? "" : ", ") + fmt::format("{} thread{}", row.threads, row.threads == 1 ? "" : "s");
  }
  if (!slower.empty())
    spdlog::warn(
        "the export runs slower than the float model in ONNX Runtime at {}: its Q/DQ cost more than its integer "
        "kernels save on this processor; {} ({:.1f} MB -> {:.1f} MB). `sparsebit profile` and ONNX Runtime's "
        "profiler show where the time goes; `skip` keeps layers float",
        slower, r.export_bytes < r.float_bytes ? "it gains size instead" : "nor is it smaller", r.float_bytes / 1e6,
        r.export_bytes / 1e6);
}

}  // namespace steps

}  // namespace sparsebit
