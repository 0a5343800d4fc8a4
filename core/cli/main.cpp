// The `sparsebit` command line: quantize, plugins, inspect.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "progress.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/bn_tuning.h"
#include "sparsebit/core/config.h"
#include "sparsebit/core/graph_dump.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/profiler.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/core/saturation.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/version.h"

namespace sb = sparsebit;
using nlohmann::json;

namespace {

struct GlobalOptions {
  int verbose = 0;
  bool quiet = false;
  int threads = 0;
};

void setup_logging(const GlobalOptions& g) {
  using sparsebit::sdk::LogLevel;
  sparsebit::sdk::log_to_stderr(g.quiet ? LogLevel::kWarn : g.verbose > 0 ? LogLevel::kDebug : LogLevel::kInfo);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = g.threads > 0 ? g.threads : cores;
  if (threads > cores) {  // more threads than cores only costs time (and creating a million takes minutes)
    spdlog::warn("--threads {}: this machine has {} cores; using {}", threads, cores, cores);
    threads = cores;
  }
  at::set_num_threads(threads);
}

// Argument checks with short messages; CLI11 prefixes the option's name.
/// A whole number of at least `low`.
CLI::Validator whole_number_from(long long low) {
  return CLI::Validator(
      [low](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end || errno || x < low)
          return "must be a whole number of at least " + std::to_string(low) + ", got '" + sb::printable(v, 40) + "'";
        return {};
      },
      "N>=" + std::to_string(low));
}
const CLI::Validator kPositiveInt = whole_number_from(1);
const CLI::Validator kNonNegativeInt = whole_number_from(0);
const CLI::Validator kPositiveFinite(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !std::isfinite(x) || !(x > 0))
        return "must be a finite number above 0, got '" + sb::printable(v, 40) + "'";
      return {};
    },
    "X>0");

const CLI::Validator kDevice(
    [](std::string& v) -> std::string {
      if (std::regex_match(v, std::regex("cpu|cuda(:[0-9]{1,3})?"))) return {};
      return "must be cpu, cuda or cuda:N, got '" + sb::printable(v, 40) + "'";
    },
    "DEVICE");

/// The final guard on every message: one line, no control characters, bounded length (the parts
/// quoted from untrusted input are bounded where they are quoted).
std::string one_line(const std::string& message) { return sb::printable(message, 4000); }

/// One line for a command-line error, exit status 1 (help and --version exit 0 as CLI11 says).
int argument_error(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);
  std::string what = e.what();
  for (const char* noise : {"\nRun with --help for more information.", "\n"})
    for (std::size_t at; (at = what.find(noise)) != std::string::npos;) what.replace(at, std::strlen(noise), " ");
  std::fprintf(stderr, "error: %s (see sparsebit --help)\n", sb::printable(what, 500).c_str());
  return 1;
}

std::string dims_text(const sb::ValueInfo& v) {
  if (!v.has_shape) return "?";
  std::string s = "[";
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    const auto& d = v.shape[i];
    s += (i ? ", " : "") + (d.value >= 0 ? std::to_string(d.value) : d.param.empty() ? std::string("?") : d.param);
  }
  return s + "]";
}

json value_info_json(const sb::ValueInfo& v) {
  json dims = json::array();
  for (const auto& d : v.shape) dims.push_back(d.value >= 0 ? json(d.value) : d.param.empty() ? json(nullptr) : json(d.param));
  return {{"name", v.name}, {"type", sb::onnx_type_name(v.elem_type)}, {"shape", v.has_shape ? dims : json(nullptr)}};
}

sb::PluginSearch plugin_search(const std::string& config_path) {
  if (config_path.empty()) return {};
  return sb::Config::from_file(config_path).plugins;
}

/// A path given on the command line and the flag that gave it.
struct PathArg {
  std::string flag, path;
  bool required = false;  ///< an empty path is an error (otherwise: not given)
};

/// Refuses, before any work, outputs that are the same file as an input or as another output:
/// by identity (device and inode) where the file exists, by absolute path with symbolic links
/// resolved where it does not yet. An empty required output is refused too.
void check_paths(const std::vector<PathArg>& inputs, const std::vector<PathArg>& outputs) {
  namespace fs = std::filesystem;
  auto identity = [](const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
    return "path " + (ec ? path : p.string());
  };
  std::map<std::string, std::string> seen;  // identity -> flag
  for (const auto& in : inputs)
    if (!in.path.empty()) seen.emplace(identity(in.path), in.flag);
  std::set<std::string> input_ids;
  for (const auto& [id, flag] : seen) input_ids.insert(id);
  for (const auto& out : outputs) {
    if (out.path.empty() && !out.required) continue;
    if (out.path.empty()) throw sb::Error(out.flag + ": the output path is empty");
    const std::string id = identity(out.path);
    auto [it, fresh] = seen.emplace(id, out.flag);
    if (!fresh) {
      throw sb::Error(out.flag + " " + sb::printable(out.path) + " is the same file as " + it->second +
                      (input_ids.count(id) ? ", an input: writing it would destroy it" : ", another output") +
                      "; choose another path");
    }
  }
}

// ---------------------------------------------------------------------------------------------

int cmd_plugins(const std::string& config_path, bool as_json) {
  sb::Registry registry;
  registry.load(plugin_search(config_path));
  const auto host = sb::host_fingerprint();
  if (as_json) {
    json j;
    j["host"] = {{"sdk_version", std::to_string(sb::sdk::kSdkVersionMajor) + "." + std::to_string(sb::sdk::kSdkVersionMinor)},
                 {"abi_version", sb::sdk::kAbiVersion},
                 {"torch_version", host.torch_version},
                 {"cuda", host.cuda},
                 {"cxx11_abi", host.cxx11_abi},
                 {"compiler", host.compiler}};
    j["searched"] = registry.searched_folders();
    json list = json::array();
    for (const auto& p : registry.plugins()) {
      json e = {{"file", p.file}, {"status", p.status_name()}, {"name", p.name}, {"version", p.version},
                {"sdk_version", p.sdk_version}, {"registered", p.registered}};
      e["fingerprint"] = {{"torch_version", p.torch_version}, {"cuda", p.cuda}, {"cxx11_abi", p.cxx11_abi}, {"compiler", p.compiler}};
      if (!p.reason.empty()) e["reason"] = p.reason;
      if (!p.gate.empty()) e["gate"] = p.gate;
      list.push_back(e);
    }
    j["plugins"] = list;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "host: SDK " << sb::sdk::kSdkVersionMajor << "." << sb::sdk::kSdkVersionMinor << ", ABI "
            << sb::sdk::kAbiVersion << ", LibTorch " << host.torch_version << ", cuda=" << host.cuda
            << ", cxx11_abi=" << host.cxx11_abi << ", " << host.compiler << "\n";
  std::cout << "searched:";
  for (const auto& f : registry.searched_folders()) std::cout << " " << f;
  std::cout << "\n\n";
  for (const auto& p : registry.plugins()) {
    std::cout << p.status_name() << "  " << (p.name.empty() ? "?" : p.name) << " " << p.version << "  (" << p.file << ")\n";
    if (!p.reason.empty()) std::cout << "    reason: " << p.reason << "\n";
    if (!p.registered.empty()) {
      std::cout << "    registers:";
      for (const auto& r : p.registered) std::cout << " " << r;
      std::cout << "\n";
    }
  }
  if (registry.plugins().empty()) std::cout << "no plugins found\n";
  return 0;
}

/// Draws the float model, or with a config the converted one with its quantizers.
void write_drawings(const std::string& model_path, const std::string& config_path, const std::string& dot,
                    const std::string& mermaid) {
  if (dot.empty() && mermaid.empty()) return;
  std::optional<sb::AtomicFile> dot_out, mermaid_out;  // claimed first: a bad path fails before work
  if (!dot.empty()) dot_out.emplace(dot);
  if (!mermaid.empty()) mermaid_out.emplace(mermaid);
  sb::Model model = sb::load_onnx(model_path);
  std::optional<sb::QuantModel> qm;
  std::map<std::string, sb::NodeNote> notes;
  sb::Registry registry;
  if (!config_path.empty()) {
    sb::Config config = sb::Config::from_file(config_path);
    registry.load(config.plugins);
    qm.emplace(std::move(model), config, registry);
    notes = sb::quant_notes(*qm);
  }
  const sb::Graph& g = qm ? qm->graph() : model.graph;
  if (dot_out) {
    dot_out->write(sb::graph_to_dot(g, notes));
    dot_out->commit();
    spdlog::info("wrote {}", dot);
  }
  if (mermaid_out) {
    mermaid_out->write(sb::graph_to_mermaid(g, notes));
    mermaid_out->commit();
    spdlog::info("wrote {}", mermaid);
  }
}

int cmd_inspect(const std::string& model_path, const std::string& config_path, bool as_json, const std::string& dot,
                const std::string& mermaid) {
  std::vector<PathArg> drawings;
  if (!dot.empty()) drawings.push_back({"--dot", dot});
  if (!mermaid.empty()) drawings.push_back({"--mermaid", mermaid});
  check_paths({{"the model", model_path}, {"-c", config_path}}, drawings);  // drawings never touch the model
  write_drawings(model_path, config_path, dot, mermaid);
  sb::Model model = sb::load_onnx(model_path, sb::ImportOptions{0});
  sb::Registry registry;
  registry.load(plugin_search(config_path));
  std::map<std::string, std::pair<int, std::string>> histogram;  // op -> (count, plugin)
  for (const auto* n : model.graph.nodes()) {
    std::string op = (n->domain.empty() ? "" : n->domain + ":") + n->op_type;
    auto& h = histogram[op];
    ++h.first;
    const auto* e = registry.op(n->op_type, n->domain);
    h.second = e ? e->plugin : "";
  }
  // Bit widths below 8 recorded by our exporter (Note [Narrow export]).
  json narrow = json::object();
  if (auto it = model.meta.metadata_props.find("sparsebit.bits"); it != model.meta.metadata_props.end()) {
    try {
      narrow = json::parse(it->second);
    } catch (const std::exception&) {
      spdlog::warn("{}: metadata sparsebit.bits is not valid JSON; ignored", model_path);
    }
  }
  int qdq = 0;
  for (const auto* n : model.graph.nodes()) qdq += n->op_type == "QuantizeLinear" || n->op_type == "DequantizeLinear";
  const sb::SaturationCheck saturation = sb::check_u8s8_saturation(model.graph);  // Note [u8s8 saturation]
  if (as_json) {
    json j;
    j["model"] = model_path;
    j["opset"] = model.graph.default_opset();
    json risks = json::array();
    for (const auto& r : saturation.at_risk)
      risks.push_back({{"node", r.node}, {"op", r.op_type}, {"weight", r.weight}, {"pairs", r.pairs},
                       {"pairs_over", r.pairs_over}, {"worst_pair", r.worst_pair}});
    j["quantization"] = {{"qdq_nodes", qdq},
                         {"narrow_bits", narrow},
                         {"u8s8_saturation", {{"layers_checked", saturation.layers_checked}, {"at_risk", risks}}}};
    j["nodes"] = model.graph.num_nodes();
    j["initializers"] = model.graph.initializers.size();
    j["inputs"] = json::array();
    for (const auto& v : model.graph.inputs) j["inputs"].push_back(value_info_json(v));
    j["outputs"] = json::array();
    for (const auto& v : model.graph.outputs) j["outputs"].push_back(value_info_json(v));
    json ops = json::array();
    for (const auto& [op, h] : histogram)
      ops.push_back({{"op", op}, {"count", h.first}, {"qmodule", !h.second.empty()}, {"plugin", h.second}});
    j["ops"] = ops;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << model_path << ": opset " << model.graph.default_opset() << ", " << model.graph.num_nodes() << " nodes, "
            << model.graph.initializers.size() << " initializers\n";
  for (const auto& v : model.graph.inputs)
    std::cout << "  input  " << v.name << ": " << sb::onnx_type_name(v.elem_type) << " " << dims_text(v) << "\n";
  for (const auto& v : model.graph.outputs)
    std::cout << "  output " << v.name << ": " << sb::onnx_type_name(v.elem_type) << " " << dims_text(v) << "\n";
  std::cout << "\n  count  op                          QModule\n";
  int missing = 0;
  for (const auto& [op, h] : histogram) {
    std::printf("  %5d  %-26s  %s\n", h.first, op.c_str(), h.second.empty() ? "MISSING" : h.second.c_str());
    missing += h.second.empty();
  }
  if (missing) std::cout << "\n" << missing << " op type(s) have no QModule; `sparsebit plugins` lists what is loaded\n";
  if (qdq) {
    std::cout << "\n  " << qdq << " QuantizeLinear/DequantizeLinear nodes";
    if (!narrow.empty()) std::cout << "; tensors quantized below 8 bits (sparsebit.bits):";
    std::cout << "\n";
    for (const auto& [tensor, bits] : narrow.items()) std::cout << "    " << tensor << ": " << bits << " bits\n";
    if (saturation.layers_checked > 0) {
      std::cout << "  u8 x s8 pair saturation (x86 without VNNI): " << saturation.at_risk.size() << " of "
                << saturation.layers_checked << " integer layers at risk\n";
      for (const auto& r : saturation.at_risk)
        std::cout << "    " << r.node << " (" << r.op_type << "): " << r.pairs_over << " of " << r.pairs
                  << " weight pairs over, worst |w_i| + |w_j| = " << r.worst_pair << "\n";
    }
  }
  return 0;
}

std::map<std::string, int> op_histogram(const sb::Graph& g) {
  std::map<std::string, int> h;
  for (const auto* n : g.nodes()) ++h[(n->domain.empty() ? "" : n->domain + ":") + n->op_type];
  return h;
}

int cmd_simplify(const std::string& model_path, const std::string& config_path, const std::string& output) {
  const sb::Config config = config_path.empty() ? sb::Config() : sb::Config::from_file(config_path);
  check_paths({{"the model", model_path}, {"-c", config_path}}, {{"-o", output, true}});
  sb::AtomicFile out(output);
  sb::Registry registry;
  registry.load(config.plugins);
  sb::Model model = sb::load_onnx(model_path);
  const auto before = op_histogram(model.graph);
  const auto nodes_before = model.graph.num_nodes();
  sb::run_passes(config.schedule, sb::Pass::Stage::kSimplify, model.graph, registry, nullptr, config.source);
  const auto after = op_histogram(model.graph);
  out.write(sb::serialize_onnx(model.graph, model.meta));
  out.commit();
  std::printf("%s: %zu -> %zu nodes\n", output.c_str(), nodes_before, model.graph.num_nodes());
  std::set<std::string> ops;
  for (const auto& [op, n] : before) ops.insert(op);
  for (const auto& [op, n] : after) ops.insert(op);
  for (const auto& op : ops) {
    const int b = before.count(op) ? before.at(op) : 0, a = after.count(op) ? after.at(op) : 0;
    if (a != b) std::printf("  %-26s %5d -> %d\n", op.c_str(), b, a);
  }
  return 0;
}

struct ProfileArgs {
  std::string model, config, calib, output = "profile", mode = "both", device;
  std::int64_t samples = 64;
  std::int64_t calib_count = -1;
};

int cmd_profile(const ProfileArgs& a, const GlobalOptions& g) {
  if (a.mode != "both" && a.mode != "accumulated" && a.mode != "single")
    throw sb::Error("--mode must be both, accumulated or single");
  sb::Config config = sb::Config::from_file(a.config);
  if (a.calib_count >= 0) config.calibration.count = static_cast<int>(a.calib_count);
  if (!a.device.empty()) config.calibration.device = a.device;
  check_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}},
              {{"-o (.json)", a.output + ".json", true}, {"-o (.html)", a.output + ".html"}});
  sb::AtomicFile json_out(a.output + ".json"), html_out(a.output + ".html");
  sb::Registry registry;
  registry.load(config.plugins);
  sb::QuantModel qm(sb::load_float_model(a.model, registry, a.calib), config, registry);
  {
    auto data = sb::open_dataset(a.calib, qm.graph().inputs);
    sb::cli::Progress bar("calibrating", !g.quiet);
    qm.calibrate(*data, [&](std::int64_t done, std::int64_t total) { bar.update(done, total); });
  }
  auto data = sb::open_dataset(a.calib, qm.graph().inputs);
  sb::ProfileOptions opt;
  opt.samples = a.samples;
  opt.accumulated = a.mode != "single";
  opt.single = a.mode != "accumulated";
  sb::cli::Progress bar("profiling layers", !g.quiet);
  opt.progress = [&](std::int64_t done, std::int64_t total) { bar.update(done, total); };
  sb::ProfileReport r = sb::profile(qm, *data, opt);
  bar.finish();
  json_out.write(sb::profile_json(r));
  html_out.write(sb::profile_html(r));
  json_out.commit();
  html_out.commit();
  std::printf("every layer quantized, at %s: MSE %.4g, cosine %.6f, SQNR %.2f dB (%lld samples)\n", r.output.c_str(),
              r.whole.mse, r.whole.cosine, r.whole.sqnr_db, static_cast<long long>(r.samples));
  auto worst = r.single.empty() ? r.accumulated : r.single;
  std::sort(worst.begin(), worst.end(), [](const sb::LayerError& x, const sb::LayerError& y) { return x.mse > y.mse; });
  std::printf("\nmost sensitive layers (%s)\n  %-40s %-18s %12s %10s %10s\n", r.single.empty() ? "accumulated" : "one at a time",
              "node", "op", "MSE", "cosine", "SQNR dB");
  for (std::size_t i = 0; i < worst.size() && i < 10; ++i)
    std::printf("  %-40s %-18s %12.4g %10.6f %10.2f\n", worst[i].node.c_str(), worst[i].op_type.c_str(), worst[i].mse,
                worst[i].cosine, worst[i].sqnr_db);
  spdlog::info("wrote {}.json and {}.html", a.output, a.output);
  return 0;
}

struct QuantizeArgs {
  std::string model, config, calib, output, report, device, mode, eval_data, eval_labels, eval_outputs, eval_fp32_outputs;
  bool external_data = false;
  int batch_size = 0, calib_count = -1;
};

/// The CLI's view of the pipeline's progress: one bar per step, closed when the step ends.
struct ProgressBars {
  bool enabled;
  std::unique_ptr<sb::cli::Progress> bar;
  std::string step;
  sb::StepProgressFn fn() {
    return [this](const std::string& name, std::int64_t done, std::int64_t total, const std::string& note) {
      if (name != step) {
        bar.reset();
        step = name;
        if (!name.empty()) bar = std::make_unique<sb::cli::Progress>(name, enabled);
      }
      if (bar) bar->update(done, total, note);
    };
  }
};

int cmd_quantize(const QuantizeArgs& a, const GlobalOptions& g) {
  sb::QuantizeJob job;
  job.config = sb::Config::from_file(a.config);
  sb::Config& config = job.config;
  if (a.batch_size > 0) config.calibration.batch_size = a.batch_size;
  if (a.calib_count >= 0) config.calibration.count = a.calib_count;
  if (!a.device.empty()) config.calibration.device = a.device;
  if (!a.mode.empty()) {
    if (a.mode != "streaming" && a.mode != "layerwise" && a.mode != "asym")
      throw sb::Error("--mode must be streaming, layerwise or asym");
    config.calibration.mode = a.mode;
  }
  check_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}, {"--eval-data", a.eval_data},
               {"--eval-labels", a.eval_labels}},
              {{"-o", a.output, true}, {"-o's external data", a.output + ".data"}, {"--report", a.report},
               {"--eval-outputs", a.eval_outputs}, {"--eval-fp32-outputs", a.eval_fp32_outputs}});
  job.model = a.model;
  job.calib = a.calib;
  job.output = a.output;
  job.report = a.report;
  job.external_data = a.external_data;
  if (!a.eval_data.empty()) job.evaluation = sb::EvaluationRequest{a.eval_data, a.eval_labels, a.eval_outputs, a.eval_fp32_outputs};
  ProgressBars bars{!g.quiet};
  const sb::QuantizeOutcome r = sb::run_quantize(job, bars.fn());
  if (r.evaluation) {
    const sb::EvaluationResult& ev = *r.evaluation;
    std::printf("\n%-28s %10s\n", "evaluation", "value");
    std::printf("%-28s %10lld\n", "samples", static_cast<long long>(ev.samples));
    if (ev.fp32_accuracy) {
      std::printf("%-28s %9.2f%%\n", "FP32 accuracy", 100 * *ev.fp32_accuracy);
      std::printf("%-28s %9.2f%%\n", "simulated quantized accuracy", 100 * *ev.simulated_accuracy);
    }
    std::printf("%-28s %9.2f%%\n", "top-1 agreement", 100 * ev.top1_agreement);
  }
  return 0;
}

struct QatArgs {
  std::string model, config, calib, train, output, report, device, checkpoint, loss;
  int epochs = 0;
  double lr = 0;
  bool restart = false;
};

int cmd_qat(const QatArgs& a, const GlobalOptions& g) {
  sb::QatJob job;
  job.config = sb::Config::from_file(a.config);
  sb::Config& config = job.config;
  if (a.epochs > 0) config.qat.epochs = a.epochs;
  if (a.lr > 0) config.qat.lr = a.lr;
  if (!a.loss.empty()) {
    if (a.loss != "mse" && a.loss != "kl") throw sb::Error("--loss must be mse or kl");
    config.qat.loss = a.loss;
  }
  if (!a.device.empty()) config.calibration.device = a.device;
  const std::string checkpoint = a.checkpoint.empty() ? a.output + ".ckpt" : a.checkpoint;
  check_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}, {"--train", a.train}},
              {{"-o", a.output, true}, {"-o's external data", a.output + ".data"}, {"--checkpoint", checkpoint}, {"--report", a.report}});
  job.model = a.model;
  job.calib = a.calib;
  job.train = a.train;
  job.output = a.output;
  job.report = a.report;
  job.checkpoint = checkpoint;
  job.restart = a.restart;
  ProgressBars bars{!g.quiet};
  sb::run_qat(job, bars.fn());
  return 0;
}

struct PruneArgs {
  std::string model, config, calib, output, report, masked, train, device;
  int finetune = 0;
};

int cmd_prune(const PruneArgs& a, const GlobalOptions& g) {
  sb::PruneJob job;
  job.config = sb::Config::from_file(a.config);
  if (!a.device.empty()) job.config.calibration.device = a.device;
  check_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}, {"--train", a.train}},
              {{"-o", a.output, true}, {"-o's external data", a.output + ".data"}, {"--report", a.report}, {"--masked", a.masked}});
  job.model = a.model;
  job.calib = a.calib;
  job.train = a.train;
  job.finetune_epochs = a.finetune;
  job.output = a.output;
  job.report = a.report;
  job.masked = a.masked;
  ProgressBars bars{!g.quiet};
  sb::run_prune(job, bars.fn());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sparsebit: quantize ONNX models to low-bit QDQ ONNX for ONNX Runtime and TensorRT"};
  app.require_subcommand(1);
  app.fallthrough();  // -v, -q and --threads work before or after the subcommand
  GlobalOptions g;
  app.add_flag("-v,--verbose", g.verbose, "More log output");
  app.add_flag("-q,--quiet", g.quiet, "Only warnings and errors");
  app.add_option("--threads", g.threads, "Intra-op threads for LibTorch (default and most: all cores)")->check(kPositiveInt);

  QuantizeArgs qa;
  auto* quantize = app.add_subcommand("quantize", "Calibrate a model and export it as QDQ ONNX");
  quantize->add_option("model", qa.model, "Float ONNX model")->required();
  quantize->add_option("-c,--config", qa.config, "TOML config (see configs/)")->required();
  quantize->add_option("--calib", qa.calib, "Calibration data: .npy folder, ONNX test-data folder, or IDX file")->required();
  quantize->add_option("-o,--output", qa.output, "Output QDQ ONNX model")->required();
  quantize->add_option("--report", qa.report, "Write a JSON report of every quantized tensor");
  quantize->add_option("--batch-size", qa.batch_size, "Calibration batch size (overrides [calibration] batch_size)")->check(kPositiveInt);
  quantize->add_option("--calib-count", qa.calib_count, "Calibration samples to use, 0 = all (overrides [calibration] count)")->check(kNonNegativeInt);
  quantize->add_option("--device", qa.device, "cpu or cuda[:N] (overrides [calibration] device)")->check(kDevice);
  quantize->add_option("--mode", qa.mode, "calibration: streaming (default), layerwise, or asym (layerwise on the quantized model's own activations)");
  quantize->add_option("--eval-data", qa.eval_data, "Also evaluate FP32 vs simulated quantized on this data");
  quantize->add_option("--eval-labels", qa.eval_labels, "IDX labels for --eval-data (prints accuracies)");
  quantize->add_option("--eval-outputs", qa.eval_outputs, "Write the simulated quantized first output on --eval-data as .npy");
  quantize->add_option("--eval-fp32-outputs", qa.eval_fp32_outputs, "Write the FP32 first output on --eval-data as .npy");
  quantize->add_flag("--external-data", qa.external_data,
                     "Write initializers of 1 KiB or more to OUTPUT.data (ONNX external data); automatic above 1 GiB");

  std::string plugins_config;
  bool plugins_json = false;
  auto* plugins = app.add_subcommand("plugins", "List plugins found, loaded or refused, and what each registers");
  plugins->add_flag("--json", plugins_json, "Machine-readable output");
  plugins->add_option("-c,--config", plugins_config, "Also search the config's [plugins] paths and apply enable/disable");

  std::string inspect_model, inspect_config, inspect_dot, inspect_mermaid;
  bool inspect_json = false;
  auto* inspect = app.add_subcommand("inspect", "Show a model's inputs, outputs and ops, and which ops have a QModule");
  inspect->add_option("model", inspect_model, "ONNX model")->required();
  inspect->add_option("-c,--config", inspect_config,
                      "Config whose [plugins] section to use; with --dot/--mermaid, draw the converted model");
  inspect->add_flag("--json", inspect_json, "Machine-readable output");
  inspect->add_option("--dot", inspect_dot, "Write a Graphviz drawing of the model (quantizers marked with -c)");
  inspect->add_option("--mermaid", inspect_mermaid, "Write a Mermaid flowchart of the model (quantizers marked with -c)");

  std::string simplify_model, simplify_config, simplify_output;
  auto* simplify = app.add_subcommand("simplify", "Run the simplify-stage passes and write the float model");
  simplify->add_option("model", simplify_model, "ONNX model")->required();
  simplify->add_option("-c,--config", simplify_config, "Config whose [schedule]/[passes]/[plugins] to use (default: all on)");
  simplify->add_option("-o,--output", simplify_output, "Output ONNX model")->required();

  ProfileArgs pa;
  auto* prof = app.add_subcommand("profile", "Per-layer quantization error (MSE, cosine, SQNR): JSON and an HTML chart");
  prof->add_option("model", pa.model, "Float ONNX model")->required();
  prof->add_option("-c,--config", pa.config, "TOML config (see configs/)")->required();
  prof->add_option("--calib", pa.calib, "Calibration data (also profiled on): .npy folder, ONNX test-data folder, IDX file")->required();
  prof->add_option("-o,--output", pa.output, "Report path without extension: writes OUTPUT.json and OUTPUT.html (default: profile)");
  prof->add_option("--samples", pa.samples, "Samples to profile on (default 64)")->check(kPositiveInt);
  prof->add_option("--mode", pa.mode, "both | accumulated (every layer quantized) | single (one layer at a time)");
  prof->add_option("--calib-count", pa.calib_count, "Calibration samples, 0 = all (overrides [calibration] count)")->check(kNonNegativeInt);
  prof->add_option("--device", pa.device, "cpu or cuda[:N] (overrides [calibration] device)")->check(kDevice);

  QatArgs qt;
  auto* qat = app.add_subcommand("qat", "Quantization-aware training by distillation from the float model (no labels needed)");
  qat->add_option("model", qt.model, "Float ONNX model")->required();
  qat->add_option("-c,--config", qt.config, "TOML config (see configs/w4a4_lsq.toml; [qat] sets the training)")->required();
  qat->add_option("--calib", qt.calib, "Calibration data for the initial quantizer parameters")->required();
  qat->add_option("--train", qt.train, "Training data (unlabeled; same layouts as --calib)")->required();
  qat->add_option("-o,--output", qt.output, "Output QDQ ONNX model")->required();
  qat->add_option("--epochs", qt.epochs, "Epochs (overrides [qat] epochs)")->check(kPositiveInt);
  qat->add_option("--lr", qt.lr, "Adam learning rate (overrides [qat] lr)")->check(kPositiveFinite);
  qat->add_option("--loss", qt.loss, "mse or kl (overrides [qat] loss)");
  qat->add_option("--device", qt.device, "cpu or cuda[:N] (overrides [calibration] device)")->check(kDevice);
  qat->add_option("--checkpoint", qt.checkpoint, "Checkpoint written after every epoch and resumed from (default OUTPUT.ckpt)");
  qat->add_flag("--restart", qt.restart, "Ignore an existing checkpoint and start from calibration");
  qat->add_option("--report", qt.report, "Write a JSON report (quantizers and per-epoch loss)");

  PruneArgs pr;
  auto* prune = app.add_subcommand("prune", "Prune a model ([sparse] in the config); with [w]/[a] too, then quantize it");
  prune->add_option("model", pr.model, "Float ONNX model")->required();
  prune->add_option("-c,--config", pr.config, "TOML config with a [sparse] table (see configs/prune_*.toml)")->required();
  prune->add_option("--calib", pr.calib,
                    "Data: its first sample fixes the shapes; required when the config also quantizes");
  prune->add_option("-o,--output", pr.output, "Output ONNX model")->required();
  prune->add_option("--report", pr.report, "Write a JSON report: parameters, file size, FLOPs before/after, every layer");
  prune->add_option("--masked", pr.masked, "Also write the masked model (original shapes, pruned weights zero)");
  prune->add_option("--finetune", pr.finetune, "Fine-tune this many epochs by distillation from the unpruned model")
      ->check(kPositiveInt);
  prune->add_option("--train", pr.train, "Training data for --finetune (unlabeled; same layouts as --calib)");
  prune->add_option("--device", pr.device, "cpu or cuda[:N] for fine-tuning (overrides [calibration] device)")->check(kDevice);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return argument_error(app, e);
  }
  try {
    setup_logging(g);
    std::string command = "sparsebit";
    for (int i = 1; i < argc && command.size() < 300; ++i) command += std::string(" ") + argv[i];
    sb::install_interrupt_cleanup(command);  // Note [Interrupted runs]
    if (*quantize) return cmd_quantize(qa, g);
    if (*plugins) return cmd_plugins(plugins_config, plugins_json);
    if (*inspect) return cmd_inspect(inspect_model, inspect_config, inspect_json, inspect_dot, inspect_mermaid);
    if (*simplify) return cmd_simplify(simplify_model, simplify_config, simplify_output);
    if (*prof) return cmd_profile(pa, g);
    if (*qat) return cmd_qat(qt, g);
    if (*prune) return cmd_prune(pr, g);
  } catch (const sb::Error& e) {
    spdlog::error("{}", one_line(e.what()));
    return 1;
  } catch (const c10::Error& e) {
    spdlog::error("{}", one_line(e.what_without_backtrace()));
    return 1;
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory; try a smaller --batch-size");
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", one_line(e.what()));
    return 1;
  }
  return 0;
}
