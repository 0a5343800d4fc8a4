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
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

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

#include "base/log.h"
#include "pipeline/ort_timer.h"
#include "pipeline/pipeline_steps.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/quant_slots.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace fs = std::filesystem;

namespace {

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

}  // namespace

namespace steps {

std::int64_t file_bytes(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<std::int64_t>(n);
}

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

}  // namespace steps

LatencyReport measure_latency(const LatencyConfig& config, const std::string& float_model,
                              const std::string& export_model, const Graph& graph, const DataSource& calib) {
  LatencyReport r;
  r.float_bytes = steps::file_bytes(float_model);
  r.export_bytes = steps::file_bytes(export_model);
  if (config.enabled == "off") {
    r.why_not = "[latency] enabled = false";
    return r;
  }
  const steps::Runtime runtime = steps::find_timer(config);
  r.runtime = runtime.folder;
  r.why_not = runtime.why_not;
  if (!r.why_not.empty()) {
    if (config.enabled == "on") throw Error("[latency] enabled = true, but " + r.why_not);
    return r;
  }
  std::string failure;
  for (const auto& row : steps::time_models(config, runtime, {float_model, export_model}, graph, calib, failure))
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

void log_latency(const LatencyReport& r) {
  if (!r.measured) {
    logs::info("latency: not measured ({}); the placement is the backend's static one", r.why_not);
    return;
  }
  std::string slower;
  for (const auto& row : r.rows) {
    logs::info("latency in ONNX Runtime, {} thread{}: float {:.2f} ms, export {:.2f} ms ({:.2f}x)", row.threads,
               row.threads == 1 ? "" : "s", row.float_ms, row.export_ms, row.float_ms / row.export_ms);
    if (row.export_ms > row.float_ms)
      slower += (slower.empty() ? "" : ", ") + fmt::format("{} thread{}", row.threads, row.threads == 1 ? "" : "s");
  }
  if (!slower.empty())
    logs::warn(
        "the export runs slower than the float model in ONNX Runtime at {}: its Q/DQ cost more than its integer "
        "kernels save on this processor; {} ({:.1f} MB -> {:.1f} MB). `sparsebit profile` and ONNX Runtime's "
        "profiler show where the time goes; `skip` keeps layers float",
        slower, r.export_bytes < r.float_bytes ? "it gains size instead" : "nor is it smaller", r.float_bytes / 1e6,
        r.export_bytes / 1e6);
}

}  // namespace steps

}  // namespace sparsebit
