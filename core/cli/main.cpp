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

/// Refuses a model that already has Q/DQ nodes: quantizing it again would put a second set of
/// quantizers around the first, which no backend deploys as meant.
void refuse_quantized(const sb::Model& model, const std::string& path) {
  int qdq = 0;
  for (const auto* n : model.graph.nodes())
    qdq += n->domain.empty() && (n->op_type == "QuantizeLinear" || n->op_type == "DequantizeLinear");
  if (qdq > 0)
    throw sb::Error(path + " is already quantized (" + std::to_string(qdq) +
                    " QuantizeLinear/DequantizeLinear nodes); quantize its float original instead");
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
  sb::Model model = sb::load_and_lift(a.model, registry, a.calib);
  refuse_quantized(model, a.model);
  sb::QuantModel qm(std::move(model), config, registry);
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

// Accuracy and agreement of the float and the simulated quantized model on labelled data.
json evaluate(sb::QuantModel& qm, const QuantizeArgs& a, bool progress_on) {
  c10::InferenceMode guard;
  auto data = sb::open_dataset(a.eval_data, qm.graph().inputs);
  at::Tensor labels;
  if (!a.eval_labels.empty()) {
    labels = sb::read_idx(a.eval_labels);
    if (labels.dim() != 1 && !(labels.dim() == 2 && labels.size(1) == 1))
      throw sb::Error(a.eval_labels + ": is not a label file: it holds an array of shape " + c10::str(labels.sizes()) +
                      "; labels are one integer per sample (an IDX file of rank 1)");
    labels = labels.to(at::kLong).reshape({-1});
  }
  bool labels_checked = false;
  sb::Batcher batcher(*data, qm.graph().inputs, std::max(qm.config().calibration.batch_size, 256), 0);
  const at::Device device(qm.config().calibration.device);
  std::int64_t n = 0, fp_correct = 0, q_correct = 0, agree = 0;
  double max_diff = 0;
  std::vector<at::Tensor> sim_outputs, fp_outputs;
  sb::cli::Progress bar("evaluating", progress_on);
  while (auto b = batcher.next()) {
    std::vector<at::Tensor> in;
    for (auto& t : b->inputs) in.push_back(t.to(device));
    qm.set_quant(false, false);
    at::Tensor fp = qm.forward(in)[0].to(at::kCPU);
    qm.set_quant(true, true);
    at::Tensor q = qm.forward(in)[0].to(at::kCPU);
    const std::int64_t rows = fp.size(0);
    if (!a.eval_outputs.empty()) sim_outputs.push_back(q);
    if (!a.eval_fp32_outputs.empty()) fp_outputs.push_back(fp);
    max_diff = std::max(max_diff, (fp - q).abs().max().item<double>());
    at::Tensor fp_top = fp.reshape({rows, -1}).argmax(1), q_top = q.reshape({rows, -1}).argmax(1);
    agree += (fp_top == q_top).sum().item<std::int64_t>();
    if (labels.defined()) {
      if (n + rows > labels.numel())
        throw sb::Error(a.eval_labels + ": has " + std::to_string(labels.numel()) + " labels, fewer than the evaluation samples");
      at::Tensor y = labels.narrow(0, n, rows);
      if (!labels_checked) {  // the model's output fixes the classes
        labels_checked = true;
        const std::int64_t classes = fp.reshape({rows, -1}).size(1);
        const std::int64_t low = labels.min().item<std::int64_t>(), high = labels.max().item<std::int64_t>();
        if (low < 0 || high >= classes)
          spdlog::warn("{}: labels run from {} to {}, outside the model's {} classes (0 to {}); the accuracy below "
                       "means nothing unless the labels belong to this model and data",
                       a.eval_labels, low, high, classes, classes - 1);
      }
      fp_correct += (fp_top == y).sum().item<std::int64_t>();
      q_correct += (q_top == y).sum().item<std::int64_t>();
    }
    n += rows;
    bar.update(n, labels.defined() ? labels.numel() : -1);
  }
  bar.finish();
  qm.set_quant(false, false);
  if (n == 0) throw sb::Error("evaluation data " + a.eval_data + " yielded no samples");
  if (!a.eval_outputs.empty()) sb::write_npy(at::cat(sim_outputs, 0), a.eval_outputs);
  if (!a.eval_fp32_outputs.empty()) sb::write_npy(at::cat(fp_outputs, 0), a.eval_fp32_outputs);
  json j = {{"samples", n}, {"top1_agreement", double(agree) / n}, {"max_abs_output_diff", max_diff}};
  if (labels.defined()) {
    j["fp32_accuracy"] = double(fp_correct) / n;
    j["int8_simulated_accuracy"] = double(q_correct) / n;
  }
  return j;
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

/// Prunes as [sparse] says and logs the before/after table.
sb::PruneResult prune_and_log(const sb::Model& model, const sb::Config& config, const sb::Registry& registry,
                              const std::string& calib) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<sb::Dataset> data;  // for bias compensation
  if (!calib.empty()) data = sb::open_dataset(calib, model.graph.inputs);
  sb::PruneResult r = sb::prune(model, config, registry, sb::sample_inputs(model.graph, calib), data.get());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string what = r.pattern == sb::SparsityPattern::kChannel ? std::to_string(r.channels_removed) + " channels removed in " +
                                                                      std::to_string(r.groups_pruned) + " of " +
                                                                      std::to_string(r.groups) + " channel groups"
                     : r.pattern == sb::SparsityPattern::kNM ? std::to_string(r.n) + ":" + std::to_string(r.m) + " sparsity"
                                                             : "unstructured sparsity";
  spdlog::info("pruned with '{}' in {:.2f} s: {}{}", r.sparser, seconds, what,
               r.bias_compensated ? ", " + std::to_string(r.bias_compensated) + " biases compensated" : std::string());
  spdlog::info("  {:<20} {:>12} {:>12} {:>8}", "", "before", "after", "ratio");
  auto row = [](const char* name, double before, double after) {
    spdlog::info("  {:<20} {:>12} {:>12} {:>7.3f}", name, human(before), human(after), before > 0 ? after / before : 0.0);
  };
  row("parameters", double(r.before.parameters), double(r.after.parameters));
  row("non-zero parameters", double(r.before.nonzero_parameters), double(r.after.nonzero_parameters));
  row("file bytes", double(r.before.file_bytes), double(r.after.file_bytes));
  row("FLOPs (dense)", 2.0 * double(r.before.macs), 2.0 * double(r.after.macs));
  row("FLOPs (non-zero)", 2.0 * double(r.before.sparse_macs), 2.0 * double(r.after.sparse_macs));
  for (const auto& n : r.notes) spdlog::debug("  {}", n);
  if (r.pattern == sb::SparsityPattern::kChannel && config.sparse->round_to == 1 && r.channels_removed > 0)
    spdlog::info("channel counts that are not multiples of 8 can run slower than the unpruned model in ONNX Runtime "
                 "and TensorRT (docs/PRUNING.md); [sparse] round_to = 8 keeps them aligned");
  return r;
}

int cmd_quantize(QuantizeArgs a, const GlobalOptions& g) {
  sb::Config config = sb::Config::from_file(a.config);
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
  // Claim the outputs first: an unwritable path fails before any work, and nothing is left
  // behind if a later step fails.
  sb::AtomicFile out(a.output);
  std::unique_ptr<sb::AtomicFile> report;
  if (!a.report.empty()) report = std::make_unique<sb::AtomicFile>(a.report);

  sb::Registry registry;
  registry.load(config.plugins);
  const auto import_start = std::chrono::steady_clock::now();
  sb::Model model = sb::load_and_lift(a.model, registry, a.calib);
  refuse_quantized(model, a.model);
  const double import_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - import_start).count();
  json pruning;
  if (config.sparse) {  // prune, then quantize the pruned model
    sb::PruneResult pr = prune_and_log(model, config, registry, a.calib);
    pruning = json::parse(sb::prune_report_json(pr));
    model = std::move(pr.pruned);
  }
  if (sb::bn_tuning_enabled(config)) model = sb::tune_batchnorm(model, config, registry, a.calib);
  sb::QuantModel qm(std::move(model), config, registry);
  auto data = sb::open_dataset(a.calib, qm.graph().inputs);
  spdlog::info("calibrating on {} ({} samples max, batch {}, {} mode, device {}, {} threads)", data->describe(),
               config.calibration.count > 0 ? std::to_string(config.calibration.count) : std::string("all"),
               config.calibration.batch_size, config.calibration.mode, config.calibration.device, at::get_num_threads());
  sb::CalibrationStats stats;
  {
    sb::cli::Progress bar("calibrating", !g.quiet);
    stats = qm.calibrate(*data, [&](std::int64_t done, std::int64_t total) { bar.update(done, total); });
  }
  spdlog::info("calibrated {} quantized inputs on {} samples in {:.2f} s", qm.slots().size(), stats.samples, stats.seconds);

  json rep = json::parse(qm.report_json(&stats));
  rep["import_ms"] = import_ms;
  if (!pruning.is_null()) rep["pruning"] = pruning;
  if (!a.eval_data.empty()) {
    json ev = evaluate(qm, a, !g.quiet);
    rep["evaluation"] = ev;
    std::printf("\n%-28s %10s\n", "evaluation", "value");
    std::printf("%-28s %10lld\n", "samples", static_cast<long long>(ev["samples"].get<std::int64_t>()));
    if (ev.contains("fp32_accuracy")) {
      std::printf("%-28s %9.2f%%\n", "FP32 accuracy", 100 * ev["fp32_accuracy"].get<double>());
      std::printf("%-28s %9.2f%%\n", "simulated quantized accuracy", 100 * ev["int8_simulated_accuracy"].get<double>());
    }
    std::printf("%-28s %9.2f%%\n", "top-1 agreement", 100 * ev["top1_agreement"].get<double>());
  }

  std::string external;
  out.write(qm.serialize(&external, std::filesystem::path(a.output).filename().string() + ".data", a.external_data));
  if (!external.empty()) {
    // The side file lands before the model that refers to it.
    sb::AtomicFile data(a.output + ".data");
    data.write(external);
    data.commit();
    spdlog::info("large initializers written to {}.data (ONNX external data)", a.output);
  }
  if (report) {
    report->write(rep.dump(2) + "\n");
    report->commit();
  }
  out.commit();
  spdlog::info("wrote {}", a.output);
  return 0;
}

struct QatArgs {
  std::string model, config, calib, train, output, report, device, checkpoint, loss;
  int epochs = 0;
  double lr = 0;
  bool restart = false;
};

// What a checkpoint must agree on to be resumed (Note [QAT checkpoints]): every input of the
// run except the epoch count.
std::string qat_fingerprint(const QatArgs& a, const sb::Config& c) {
  auto file_id = [](const std::string& path) {  // size and a hash of the first MiB
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    std::string head(1 << 20, '\0');
    std::ifstream in(path, std::ios::binary);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    return path + "#" + std::to_string(ec ? 0 : size) + "#" + std::to_string(std::hash<std::string>{}(head));
  };
  std::ostringstream s;
  s << file_id(a.model) << "|" << file_id(a.config) << "|" << std::filesystem::absolute(a.calib).string() << "|"
    << std::filesystem::absolute(a.train).string() << "|" << c.qat.lr << "|" << c.qat.weight_decay << "|" << c.qat.batch_size
    << "|" << c.qat.count << "|" << c.qat.loss << "|" << c.qat.temperature << "|" << c.qat.seed << "|"
    << c.calibration.batch_size << "|" << c.calibration.count << "|" << c.calibration.mode;
  return s.str();
}

int cmd_qat(QatArgs a, const GlobalOptions& g) {
  sb::Config config = sb::Config::from_file(a.config);
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
  if (a.restart) std::filesystem::remove(checkpoint);
  sb::AtomicFile out(a.output);
  std::unique_ptr<sb::AtomicFile> report;
  if (!a.report.empty()) report = std::make_unique<sb::AtomicFile>(a.report);

  sb::Registry registry;
  registry.load(config.plugins);
  sb::Model float_model = sb::load_and_lift(a.model, registry, a.calib);
  refuse_quantized(float_model, a.model);
  sb::Executor teacher(float_model.graph, registry);
  teacher.to(config.calibration.device);
  sb::QuantModel qm(sb::load_and_lift(a.model, registry, a.calib), config, registry);  // its own tensors: QAT trains them
  const auto& inputs = qm.graph().inputs;
  sb::CalibrationStats stats;
  {
    auto calib = sb::open_dataset(a.calib, inputs);
    sb::cli::Progress bar("calibrating", !g.quiet);
    stats = qm.init_qat(*calib, [&](std::int64_t done, std::int64_t total) { bar.update(done, total); });
  }
  spdlog::info("training {} epoch(s) on {} (batch {}, Adam lr {}, {} distillation loss, device {}, {} threads)", config.qat.epochs,
               a.train, config.qat.batch_size, config.qat.lr, config.qat.loss, config.calibration.device, at::get_num_threads());
  sb::QatOptions options{config.qat, checkpoint, qat_fingerprint(a, config)};
  std::unique_ptr<sb::cli::Progress> bar;
  int bar_epoch = 0;
  const sb::QatResult result = sb::distill(
      qm, teacher, [&] { return sb::open_dataset(a.train, inputs); }, options,
      [&](int epoch, std::int64_t done, std::int64_t total, double loss) {
        if (epoch != bar_epoch) {
          bar = std::make_unique<sb::cli::Progress>("epoch " + std::to_string(epoch) + "/" + std::to_string(config.qat.epochs),
                                                    !g.quiet);
          bar_epoch = epoch;
        }
        char note[64];
        std::snprintf(note, sizeof note, " loss %.4g", loss);
        bar->update(done, total, note);
      });
  bar.reset();

  json rep = json::parse(qm.report_json(&stats));
  rep["qat"] = {{"resumed_after_epoch", result.resumed_after}, {"checkpoint", checkpoint}, {"loss", config.qat.loss},
                {"lr", config.qat.lr}, {"epochs", json::array()}};
  for (const auto& e : result.epochs)
    rep["qat"]["epochs"].push_back({{"epoch", e.epoch}, {"loss", e.loss}, {"samples", e.samples}, {"seconds", e.seconds}});
  std::string external;
  out.write(qm.serialize(&external, std::filesystem::path(a.output).filename().string() + ".data"));
  if (!external.empty()) {
    sb::AtomicFile data(a.output + ".data");
    data.write(external);
    data.commit();
  }
  if (report) {
    report->write(rep.dump(2) + "\n");
    report->commit();
  }
  out.commit();
  spdlog::info("wrote {} (checkpoint {} kept: rerun with more --epochs to continue, --restart to start over)", a.output,
               checkpoint);
  return 0;
}

struct PruneArgs {
  std::string model, config, calib, output, report, masked, train, device;
  int finetune = 0;
};

int cmd_prune(const PruneArgs& a, const GlobalOptions& g) {
  sb::Config config = sb::Config::from_file(a.config);
  if (!config.sparse) throw sb::Error(a.config + ": no [sparse] table; add one, e.g. [sparse] sparser = \"l1_structured\", ratio = 0.5");
  const bool quantize = config.quantization_given;
  if (quantize && a.calib.empty())
    throw sb::Error(a.config + " also quantizes ([w]/[a]): pass --calib with calibration data");
  if (a.finetune > 0 && a.train.empty()) throw sb::Error("--finetune needs --train with training data");
  if (a.finetune > 0) config.qat.epochs = a.finetune;
  if (!a.device.empty()) config.calibration.device = a.device;
  check_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}, {"--train", a.train}},
              {{"-o", a.output, true}, {"-o's external data", a.output + ".data"}, {"--report", a.report}, {"--masked", a.masked}});
  sb::AtomicFile out(a.output);
  std::unique_ptr<sb::AtomicFile> report, masked;
  if (!a.report.empty()) report = std::make_unique<sb::AtomicFile>(a.report);
  if (!a.masked.empty()) masked = std::make_unique<sb::AtomicFile>(a.masked);

  sb::Registry registry;
  registry.load(config.plugins);
  sb::Model model = sb::load_and_lift(a.model, registry, a.calib);
  sb::PruneResult r = prune_and_log(model, config, registry, a.calib);
  json rep = json::parse(sb::prune_report_json(r));
  rep["model"] = a.model;
  rep["config"] = a.config;
  if (masked) masked->write(sb::serialize_onnx(r.masked.graph, r.masked.meta));

  const std::vector<sb::ValueInfo> inputs = r.pruned.graph.inputs;  // a copy: the model moves below
  auto progress_for = [&](std::unique_ptr<sb::cli::Progress>& bar, int& bar_epoch, int epochs) {
    return [&, epochs](int epoch, std::int64_t done, std::int64_t total, double loss) {
      if (epoch != bar_epoch) {
        bar = std::make_unique<sb::cli::Progress>("fine-tuning " + std::to_string(epoch) + "/" + std::to_string(epochs), !g.quiet);
        bar_epoch = epoch;
      }
      char note[64];
      std::snprintf(note, sizeof note, " loss %.4g", loss);
      bar->update(done, total, note);
    };
  };
  std::string bytes, external;
  const std::string location = std::filesystem::path(a.output).filename().string() + ".data";
  if (quantize) {
    sb::QuantModel qm(std::move(r.pruned), config, registry);
    auto calib = sb::open_dataset(a.calib, inputs);
    sb::CalibrationStats stats;
    if (a.finetune > 0) {
      {
        sb::cli::Progress bar("calibrating", !g.quiet);
        stats = qm.init_qat(*calib, [&](std::int64_t done, std::int64_t total) { bar.update(done, total); });
      }
      // Zeros left by element / N:M pruning stay zero while training.
      std::vector<std::pair<at::Tensor, at::Tensor>> keep;
      for (const auto& [name, t] : qm.named_parameters())
        if (name.rfind("weight ", 0) == 0 && t.dim() >= 2 && (t == 0).any().item<bool>()) keep.emplace_back(t, (t != 0).to(t.scalar_type()));
      sb::Executor teacher(model.graph, registry);
      teacher.to(config.calibration.device);
      sb::QatOptions options{config.qat, "", ""};
      options.after_step = [&] {
        c10::NoGradGuard no_grad;
        for (auto& [t, mask] : keep) t.mul_(mask);
      };
      std::unique_ptr<sb::cli::Progress> bar;
      int bar_epoch = 0;
      auto result = sb::distill(qm, teacher, [&] { return sb::open_dataset(a.train, inputs); }, options,
                                progress_for(bar, bar_epoch, config.qat.epochs));
      bar.reset();
      rep["finetune"] = {{"epochs", json::array()}, {"quantization_aware", true}};
      for (const auto& e : result.epochs) rep["finetune"]["epochs"].push_back({{"epoch", e.epoch}, {"loss", e.loss}});
    } else {
      sb::cli::Progress bar("calibrating", !g.quiet);
      stats = qm.calibrate(*calib, [&](std::int64_t done, std::int64_t total) { bar.update(done, total); });
    }
    rep["quantization"] = json::parse(qm.report_json(&stats));
    bytes = qm.serialize(&external, location);
  } else {
    if (a.finetune > 0) {
      std::unique_ptr<sb::cli::Progress> bar;
      int bar_epoch = 0;
      const auto losses = sb::finetune(r.pruned, model, registry, [&] { return sb::open_dataset(a.train, inputs); }, config.qat,
                                       config.calibration.device, progress_for(bar, bar_epoch, config.qat.epochs));
      bar.reset();
      rep["finetune"] = {{"epoch_loss", losses}, {"quantization_aware", false}};
    }
    bytes = sb::serialize_onnx(r.pruned.graph, r.pruned.meta, {}, &external, location);
  }
  if (!external.empty()) {
    sb::AtomicFile data(a.output + ".data");
    data.write(external);
    data.commit();
  }
  out.write(bytes);
  if (masked) masked->commit();
  if (report) {
    report->write(rep.dump(2) + "\n");
    report->commit();
  }
  out.commit();
  spdlog::info("wrote {}{}", a.output, quantize ? " (pruned, then quantized)" : "");
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
