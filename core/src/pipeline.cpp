#include "sparsebit/core/pipeline.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "digest.h"
#include "glob.h"
#include "reports.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/bn_tuning.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Adapts a StepProgressFn to the (done, total) callbacks of calibration and evaluation.
ProgressFn stage(const StepProgressFn& progress, const std::string& name) {
  if (!progress) return {};
  return [progress, name](std::int64_t done, std::int64_t total) { progress(name, done, total, ""); };
}

/// Note [Distributed runs]: every process has finished its work (a failed one stops the others
/// here, before anything is written); true in the one process that writes the outputs.
bool writes_files() {
  if (Distributed* d = distributed()) d->barrier("finishing before rank 0 writes the outputs");
  return writes_outputs();
}

void end_step(const StepProgressFn& progress) {
  if (progress) progress("", 0, 0, "");
}

/// Adapts it to the (epoch, done, total, loss) callbacks of training; `what` names the epochs.
QatProgressFn epochs(const StepProgressFn& progress, const std::string& what, int total_epochs) {
  if (!progress) return {};
  return [progress, what, total_epochs](int epoch, std::int64_t done, std::int64_t total, double loss) {
    char note[64];
    std::snprintf(note, sizeof note, " loss %.4g", loss);
    progress(what + std::to_string(epoch) + "/" + std::to_string(total_epochs), done, total, note);
  };
}

/// The files of one job, claimed before any work and committed in the order of
/// Note [Pipeline order]. The side file's name is known only after export (it holds whatever
/// the exporter moved out of the model), so it is created at commit time.
class JobFiles {
 public:
  JobFiles(const std::string& model, const std::string& report, const std::string& masked = "")
      : model_path_(model), model_(model) {
    if (!report.empty()) report_ = std::make_unique<AtomicFile>(report);
    if (!masked.empty()) masked_ = std::make_unique<AtomicFile>(masked);
  }
  /// Where the exporter points external tensors: the side file's name, relative to the model.
  std::string external_location() const { return default_side_file(model_path_); }
  void set_model(const std::string& bytes) { model_.write(bytes); }
  void set_masked(const std::string& bytes) {
    if (masked_) masked_->write(bytes);
  }
  bool wants_masked() const { return masked_ != nullptr; }
  /// Writes the side file (if any external tensors), the masked model, the report, then the model.
  bool commit(const std::string& external, const std::string& report) {
    const bool side = write_side_file(model_path_, external);  // Note [External data side file]
    if (side) spdlog::info("large initializers written to {}.data (ONNX external data)", model_path_);
    if (masked_) masked_->commit();
    if (report_) {
      report_->write(report + "\n");
      report_->commit();
    }
    model_.commit();
    return side;
  }

 private:
  std::string model_path_;
  AtomicFile model_;
  std::unique_ptr<AtomicFile> report_, masked_;
};

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

/// The per-op-type times of a calibration (Note [Op timing]), largest first, at debug level.
void log_op_times(const std::map<std::string, OpTime>& times, double total) {
  std::vector<std::pair<std::string, OpTime>> rows(times.begin(), times.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.second.seconds + a.second.hook_seconds > b.second.seconds + b.second.hook_seconds;
  });
  double ops = 0, hooks = 0;
  for (const auto& [op, t] : rows) {
    ops += t.seconds;
    hooks += t.hook_seconds;
  }
  spdlog::debug(
      "calibration time by op type: {:.2f} s in ops, {:.2f} s observing/quantizing their inputs, "
      "{:.2f} s elsewhere (data loading, parameters)",
      ops, hooks, std::max(0.0, total - ops - hooks));
  spdlog::debug("  {:<24} {:>7} {:>10} {:>12} {:>6}", "op", "calls", "op s", "inputs s", "share");
  for (const auto& [op, t] : rows)
    spdlog::debug("  {:<24} {:>7} {:>10.3f} {:>12.3f} {:>5.1f}%", op, t.calls, t.seconds, t.hook_seconds,
                  total > 0 ? 100 * (t.seconds + t.hook_seconds) / total : 0.0);
}

/// A dataset that notes the sizes its records give each model input (InputCoverage).
class CoverageRecorder final : public Dataset {
 public:
  CoverageRecorder(std::unique_ptr<Dataset> data, const std::vector<ValueInfo>& inputs)
      : data_(std::move(data)), inputs_(inputs), seen_(inputs.size()) {}
  std::string describe() const override { return data_->describe(); }
  std::optional<std::int64_t> num_samples() const override { return data_->num_samples(); }
  std::optional<Batch> next() override {
    auto b = data_->next();
    if (!b) return b;
    for (std::size_t i = 0; i < b->inputs.size() && i < inputs_.size(); ++i) {
      const at::Tensor& t = b->inputs[i];
      const auto rank = static_cast<std::int64_t>(inputs_[i].shape.size());
      if (!t.defined() || rank < 2 || t.dim() < rank - 1) continue;
      auto& c = seen_[i];
      for (std::int64_t d = 1; d < rank; ++d) {  // sample dims, aligned from the right
        const std::int64_t size = t.size(t.dim() - rank + d);
        const auto k = static_cast<std::size_t>(d - 1);
        if (c.min.size() <= k) c.min.push_back(size), c.max.push_back(size);
        c.min[k] = std::min(c.min[k], size);
        c.max[k] = std::max(c.max[k], size);
      }
    }
    return b;
  }
  /// The inputs with an open sample dimension.
  std::vector<InputCoverage> coverage() const {
    std::vector<InputCoverage> out;
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      InputCoverage c = seen_[i];
      c.input = inputs_[i].name;
      bool any = false;
      for (std::size_t d = 1; d < inputs_[i].shape.size(); ++d) {
        const Dim& dim = inputs_[i].shape[d];
        c.open.push_back(!(dim.value > 0 && dim.param.empty()));
        any = any || c.open.back();
      }
      if (any && c.min.size() == c.open.size()) out.push_back(std::move(c));
    }
    return out;
  }

 private:
  std::unique_ptr<Dataset> data_;
  std::vector<ValueInfo> inputs_;
  std::vector<InputCoverage> seen_;
};

std::string describe_dims(const InputCoverage& c) {
  std::string s = "[N";
  for (std::size_t d = 0; d < c.min.size(); ++d)
    s += ", " +
         (c.min[d] == c.max[d] ? std::to_string(c.min[d]) : std::to_string(c.min[d]) + ".." + std::to_string(c.max[d]));
  return s + "]";
}

void log_coverage(const std::vector<InputCoverage>& coverage) {
  for (const auto& c : coverage) {
    bool fixed = true;
    for (std::size_t d = 0; d < c.open.size(); ++d) fixed = fixed && (!c.open[d] || c.min[d] == c.max[d]);
    spdlog::info(
        "calibration data gave input '{}' the sizes {}{}", c.input, describe_dims(c),
        fixed ? "; the model accepts other sizes in its open dimensions: ranges calibrated on one size can be off "
                "for others, so calibrate on the sizes it will run on"
              : "");
  }
}

/// Note [Agreement check]
/// After calibration (and the target), every quantize runs the model in float and quantized on
/// a few samples and compares each floating output: cosine over the whole output and SQNR
/// (10 log10 of signal over error energy). The samples are held out where the data allows (those
/// after [calibration] count, or the target's holdout), else the first calibration samples, and
/// the message says which. A cosine below AgreementCheck::kPoorCosine warns with what to try.
/// Eight samples cost two forward passes over them: small beside calibration. Weight-only runs
/// skip it: they read no data and keep host memory near one copy of the weights.
AgreementCheck check_agreement(QuantModel& qm, const QuantizeJob& job, std::int64_t target_holdout) {
  constexpr std::int64_t kSamples = 8;
  c10::InferenceMode guard;
  const auto& inputs = qm.graph().inputs;
  const Config& config = job.config;
  AgreementCheck r;
  std::int64_t first = 0;
  if (target_holdout > 0) {
    r.held_out = true;
  } else if (config.calibration.count > 0) {
    auto probe = open_dataset(job.calib, inputs);
    const auto n = probe->num_samples();
    if (n && *n > config.calibration.count) first = config.calibration.count, r.held_out = true;
  }
  const std::int64_t take = target_holdout > 0 ? std::min(kSamples, target_holdout) : kSamples;
  SampleWindow window(open_dataset(job.calib, inputs), inputs, first, take);
  Batcher batches(window, inputs,
                  std::max<std::int64_t>(1, std::min<std::int64_t>(config.calibration.batch_size, take)), take);
  const at::Device device(config.calibration.device);
  const auto& outs = qm.graph().outputs;
  std::vector<double> ff(outs.size(), 0), qq(outs.size(), 0), fq(outs.size(), 0), ee(outs.size(), 0);
  std::vector<bool> floating(outs.size(), false);
  while (auto b = batches.next()) {
    std::vector<at::Tensor> in;
    for (auto& t : b->inputs) in.push_back(t.to(device));
    qm.set_quant(false, false);
    const auto f = qm.forward(in);
    qm.set_quant(true, true);
    const auto q = qm.forward(in);
    for (std::size_t i = 0; i < outs.size() && i < f.size() && i < q.size(); ++i) {
      if (!f[i].defined() || f[i].is_nested() || !f[i].is_floating_point() || f[i].sizes() != q[i].sizes()) continue;
      floating[i] = true;
      const at::Tensor a = f[i].to(at::kDouble).nan_to_num(0, 0, 0), c = q[i].to(at::kDouble).nan_to_num(0, 0, 0);
      ff[i] += a.mul(a).sum().item<double>();
      qq[i] += c.mul(c).sum().item<double>();
      fq[i] += a.mul(c).sum().item<double>();
      ee[i] += (a - c).pow(2).sum().item<double>();
    }
    r.samples += b->rows;
  }
  qm.set_quant(false, false);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (!floating[i]) continue;
    AgreementCheck::Output o;
    o.name = outs[i].name;
    o.cosine = ff[i] > 0 && qq[i] > 0 ? fq[i] / std::sqrt(ff[i] * qq[i]) : (ee[i] == 0 ? 1.0 : 0.0);
    o.sqnr_db = ee[i] > 0 ? 10 * std::log10(std::max(ff[i], 1e-300) / ee[i]) : std::numeric_limits<double>::infinity();
    r.poor = r.poor || o.cosine < AgreementCheck::kPoorCosine;
    r.outputs.push_back(o);
  }
  return r;
}

void log_agreement(const AgreementCheck& a) {
  const std::string on = std::to_string(a.samples) + (a.held_out ? " held-out samples" : " calibration samples");
  for (const auto& o : a.outputs)
    spdlog::info("quantized vs float on {}: output '{}' cosine {:.4f}, SQNR {:.1f} dB", on, o.name, o.cosine,
                 o.sqnr_db);
  if (a.poor)
    spdlog::warn(
        "the quantized model agrees poorly with float (cosine below {} on {}): `sparsebit profile` shows which "
        "layers lose it, --target \"cosine>=0.99\" keeps the most sensitive ones in higher precision, and another "
        "[a] observer (auto, mse, percentile) may do better",
        AgreementCheck::kPoorCosine, on);
}

/// Nothing quantized is almost never what the user meant: say why, loudly.
void warn_if_nothing_quantized(QuantModel& qm, const Config& config) {
  std::size_t active = 0, in_bodies = 0;
  for (const auto& s : qm.slots()) {
    active += s.active();
    in_bodies += s.node_index >= qm.graph().num_nodes();
  }
  if (active > 0) return;
  const std::size_t body_nodes = qm.executor().flat_size() - qm.graph().num_nodes();
  std::string why = std::to_string(qm.slots().size()) + " quantizable inputs were fused away by backend '" +
                    config.backend + "''s placement rules and the fuse passes";
  std::size_t skipped = 0;
  for (const Node* n : qm.graph().nodes()) skipped += matches_any(n->name, config.skip);
  if (qm.slots().empty())
    why = skipped > 0 ? "the skip globs keep " + std::to_string(skipped) +
                            " nodes float, and no other node has an input its op quantizes"
                      : "no node of the model has an input its op quantizes";
  if (body_nodes > 0)
    why += "; " + std::to_string(body_nodes) + " of the model's " + std::to_string(qm.executor().flat_size()) +
           " nodes sit inside If/Loop/Scan bodies (" + std::to_string(in_bodies) + " of the quantizable inputs)";
  spdlog::warn(
      "NOTHING IS QUANTIZED: 0 quantized inputs ({}); the output runs in float. `sparsebit inspect` lists the ops "
      "and which have a QModule; another backend may quantize what this one leaves",
      why);
}

/// Calibrates the QuantModel on `data`, logging what it does.
CalibrationStats calibrate(QuantModel& qm, Dataset& data, const Config& config, const StepProgressFn& progress) {
  spdlog::info("calibrating on {} ({} samples max, batch {}, {} mode, device {}, {} threads)", data.describe(),
               config.calibration.count > 0 ? std::to_string(config.calibration.count) : std::string("all"),
               config.calibration.batch_size, config.calibration.mode, config.calibration.device,
               at::get_num_threads());
  const bool timing = spdlog::should_log(spdlog::level::debug);
  qm.executor().reset_op_times();
  qm.executor().set_op_timing(timing);
  CalibrationStats stats = qm.calibrate(data, stage(progress, "calibrating"));
  qm.executor().set_op_timing(false);
  end_step(progress);
  if (stats.samples == 0)  // weight-only, streaming: nothing needed the data
    spdlog::info("calibrated {} quantized weights in {:.2f} s", qm.slots().size(), stats.seconds);
  else
    spdlog::info("calibrated {} quantized inputs on {} samples in {:.2f} s", qm.slots().size(), stats.samples,
                 stats.seconds);
  if (stats.range_selected_inputs > 0) {  // Note [Choosing ranges by the consuming layer]
    std::string chosen;
    for (const auto& [name, n] : stats.range_choices)
      chosen += (chosen.empty() ? "" : ", ") + name + " " + std::to_string(n);
    spdlog::info("  ranges chosen by their layer's error on {} samples for {} inputs in {:.2f} s: {}",
                 stats.range_selection_samples, stats.range_selected_inputs, stats.range_selection_seconds, chosen);
  }
  if (timing) {
    log_op_times(qm.executor().op_times(), stats.seconds);
    const CpuCacheStats c = caching_cpu_allocator_stats();
    if (c.hits + c.misses > 0)
      spdlog::debug("large CPU blocks (Note [Caching CPU allocator]): {} reused, {} mapped, {:.0f} MiB cached now",
                    c.hits, c.misses, double(c.cached_bytes) / (1 << 20));
  }
  return stats;
}

CalibrationStats calibrate(QuantModel& qm, const std::string& calib, const Config& config,
                           const StepProgressFn& progress) {
  auto data = open_dataset(calib, qm.graph().inputs);
  return calibrate(qm, *data, config, progress);
}

/// How many calibration samples the accuracy target keeps apart (Note [Accuracy target]): as
/// asked, or a quarter of a set smaller than twice that; 0 measures on calibration samples.
std::int64_t holdout_count(const TargetConfig& t, const std::string& calib, const std::vector<ValueInfo>& inputs) {
  std::int64_t h = t.holdout;
  if (h == 0) return 0;
  auto data = open_dataset(calib, inputs);
  std::optional<std::int64_t> n = data->num_samples();
  if (!n) {  // unknown without reading (a file may hold a batch): count up to what matters
    Batcher count(*data, inputs, 2 * h, 2 * h);
    while (count.next()) {
    }
    n = count.samples_delivered();
  }
  if (*n < 2 * h) {
    h = *n / 4;
    spdlog::info(
        "target: {} has {} samples; {} are kept apart to measure {} (with so few, [target] holdout = 0 measures on "
        "the calibration samples and keeps them all for the ranges)",
        calib, *n, h, t.metric);
  }
  return h;
}

/// The calibration samples: all of them, or all but the first `holdout`.
QuantModel::DataSource calibration_source(const std::string& calib, const std::vector<ValueInfo>& inputs,
                                          std::int64_t holdout) {
  return [calib, inputs, holdout]() -> std::unique_ptr<Dataset> {
    if (holdout == 0) return open_dataset(calib, inputs);
    return std::make_unique<SampleWindow>(open_dataset(calib, inputs), inputs, holdout, 0);
  };
}

/// Calibrates on all but the held-out samples, then meets the target.
TargetReport meet_target_step(QuantModel& qm, const QuantizeJob& job, std::int64_t holdout,
                              const QuantModel::DataSource& calibration, CalibrationStats& stats,
                              std::vector<InputCoverage>& coverage, const Registry& registry,
                              const StepProgressFn& progress) {
  const TargetConfig& t = *job.config.target;
  const auto& inputs = qm.graph().inputs;
  {
    CoverageRecorder recorded(calibration(), inputs);
    stats = calibrate(qm, recorded, job.config, progress);
    coverage = recorded.coverage();
  }
  TargetData data;
  const std::int64_t measured = holdout > 0 ? holdout : 16;
  SampleWindow held(open_dataset(job.calib, inputs), inputs, 0, measured);
  const at::Device device(job.config.calibration.device);
  Batcher one(held, inputs, 1, 0);
  while (auto b = one.next()) {
    for (auto& x : b->inputs) x = x.to(device);
    data.holdout.push_back(std::move(b->inputs));
  }
  data.holdout_description = std::to_string(data.holdout.size()) +
                             (holdout > 0 ? " held-out calibration samples" : " calibration samples (no holdout)");
  data.calibration = calibration;
  if (t.metric == "top1-drop") {
    auto eval = open_dataset(job.evaluation->data, inputs);
    Batcher batches(*eval, inputs, std::max(job.config.calibration.batch_size, 256), 0);
    while (auto b = batches.next()) {
      for (auto& x : b->inputs) x = x.to(device);
      data.eval.push_back(std::move(b->inputs));
    }
    data.eval_labels = read_labels(job.evaluation->labels);
    data.eval_description = job.evaluation->data;
  }
  if (const auto* histogram = registry.observer("auto")) data.range_observer = histogram->factory;
  spdlog::info("target {}: measuring on {}", t.describe(), data.holdout_description);
  TargetReport r = meet_target(qm, t, data, stage(progress, "measuring layers"));
  end_step(progress);
  std::string remedies;
  std::size_t costly = 0;
  for (const auto& [name, n] : r.remedies) {
    remedies += (remedies.empty() ? "" : ", ") + name + " " + std::to_string(n);
    if (name == "int16" || name == "float") costly += n;
  }
  spdlog::info(
      "target {}: {} {:.6g} with every layer quantized, {:.6g} with {} of {} layers remedied{} ({} "
      "evaluations, {:.1f} s)",
      t.describe(), t.metric, r.before, r.after, r.fallback_layers.size(), r.quantized_layers,
      remedies.empty() ? "" : " (" + remedies + ")", r.evaluations, r.seconds);
  for (const auto& l : r.fallback_layers)
    spdlog::info("  {} {} ({}): layer SQNR {:.1f} -> {:.1f} dB", l.remedy, l.node, l.op_type, l.sqnr_db,
                 l.remedied_sqnr_db);
  if (!r.reached) {
    const std::string missed = "target " + t.describe() + " not reached: best " + t.metric + " " +
                               std::to_string(r.after) + " with " + std::to_string(r.fallback_layers.size()) +
                               " layers remedied, " + std::to_string(costly) + " of them in int16 or float (budget " +
                               std::to_string(r.budget) + ")";
    if (t.strict)
      throw Error(missed +
                  "; nothing written (strict target). Allow more fallback layers "
                  "([target] max_fallback_layers) or a lower target");
    spdlog::warn("{}; writing the best model found", missed);
  }
  return r;
}

// What a QAT checkpoint must agree on to be resumed (Note [QAT checkpoints]): every input of
// the run except the epoch count.
std::string qat_fingerprint(const QatJob& job) {
  auto file_id = [](const std::string& path) {  // size and a hash of the first MiB
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    std::string head(1 << 20, '\0');
    std::ifstream in(path, std::ios::binary);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    return path + "#" + std::to_string(ec ? 0 : size) + "#" + std::to_string(std::hash<std::string>{}(head));
  };
  const Config& c = job.config;
  std::ostringstream s;
  s << file_id(job.model) << "|" << file_id(c.source) << "|" << fs::absolute(job.calib).string() << "|"
    << fs::absolute(job.train).string() << "|" << c.qat.lr << "|" << c.qat.weight_decay << "|" << c.qat.batch_size
    << "|" << c.qat.count << "|" << c.qat.loss << "|" << c.qat.temperature << "|" << c.qat.seed << "|" << c.qat.tf32
    << "|" << c.calibration.batch_size << "|" << c.calibration.count << "|" << c.calibration.mode;
  return s.str();
}

// Note [Same job on every rank]: what the ranks of a distributed run compare at the rendezvous.
// Files by content (size and digest), so copies on several hosts agree; data by the path as
// given; and the settings the command line can change over the config's text.
std::string file_identity(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path + " (a folder)";
  std::ifstream in(path, std::ios::binary);
  if (!in) return path + " (unreadable)";
  Digest64 digest;
  std::string chunk(std::size_t{1} << 22, '\0');
  std::uint64_t size = 0;
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
    digest.mix(chunk.data(), static_cast<std::size_t>(in.gcount()));
    size += static_cast<std::uint64_t>(in.gcount());
  }
  return fmt::format("{} bytes, digest {:016x}", size, digest.value);
}

JobDescription describe_run(const std::string& command, const std::string& model, const Config& c,
                            const std::string& calib) {
  JobDescription d{{"command", command},
                   {"model", file_identity(model)},
                   {"config", fmt::format("{:016x}", c.text_digest)},
                   {"calibration data", calib.empty() ? "(none)" : calib},
                   {"calibration count", std::to_string(c.calibration.count)},
                   {"calibration batch size", std::to_string(c.calibration.batch_size)},
                   {"calibration mode", c.calibration.mode},
                   {"device type", at::Device(c.calibration.device).is_cuda() ? "cuda" : c.calibration.device},
                   {"target", c.target ? c.target->describe() : "(none)"}};
  return d;
}

JobDescription describe_run(const QuantizeJob& job) {
  return describe_run("quantize", job.model, job.config, job.calib);
}

JobDescription describe_run(const QatJob& job) {
  JobDescription d = describe_run("qat", job.model, job.config, job.calib);
  d.insert(d.end(), {{"training data", job.train},
                     {"epochs", std::to_string(job.config.qat.epochs)},
                     {"learning rate", fmt::format("{}", job.config.qat.lr)},
                     {"loss", job.config.qat.loss},
                     {"restart", job.restart ? "yes" : "no"}});
  return d;
}

JobDescription describe_run(const PruneJob& job) {
  JobDescription d = describe_run("prune", job.model, job.config, job.calib);
  d.insert(d.end(), {{"training data", job.train.empty() ? "(none)" : job.train},
                     {"fine-tuning epochs", std::to_string(job.finetune_epochs)}});
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Steps

Model load_float_model(const std::string& path, const Registry& registry, const std::string& calib) {
  Model model = load_and_lift(path, registry, calib);
  // Quantizing a QDQ model again would put a second set of quantizers around the first, which
  // no backend deploys as meant.
  int qdq = 0;
  for (const auto* n : model.graph.nodes())
    qdq += n->domain.empty() && (n->op_type == "QuantizeLinear" || n->op_type == "DequantizeLinear");
  if (qdq > 0)
    throw Error(path + " is already quantized (" + std::to_string(qdq) +
                " QuantizeLinear/DequantizeLinear nodes); quantize its float original instead");
  return model;
}

PruneResult prune_step(const Model& model, const Config& config, const Registry& registry, const std::string& calib) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Dataset> data;  // for bias compensation
  if (!calib.empty()) data = open_dataset(calib, model.graph.inputs);
  PruneResult r = prune(model, config, registry, sample_inputs(model.graph, calib), data.get());
  const double seconds = ms_since(t0) / 1000;
  std::string what = r.pattern == SparsityPattern::kChannel
                         ? std::to_string(r.channels_removed) + " channels removed in " +
                               std::to_string(r.groups_pruned) + " of " + std::to_string(r.groups) + " channel groups"
                     : r.pattern == SparsityPattern::kNM ? std::to_string(r.n) + ":" + std::to_string(r.m) + " sparsity"
                                                         : "unstructured sparsity";
  spdlog::info("pruned with '{}' in {:.2f} s: {}{}", r.sparser, seconds, what,
               r.bias_compensated ? ", " + std::to_string(r.bias_compensated) + " biases compensated" : std::string());
  spdlog::info("  {:<20} {:>12} {:>12} {:>8}", "", "before", "after", "ratio");
  auto row = [](const char* name, double before, double after) {
    spdlog::info("  {:<20} {:>12} {:>12} {:>7.3f}", name, human(before), human(after),
                 before > 0 ? after / before : 0.0);
  };
  row("parameters", double(r.before.parameters), double(r.after.parameters));
  row("non-zero parameters", double(r.before.nonzero_parameters), double(r.after.nonzero_parameters));
  row("file bytes", double(r.before.file_bytes), double(r.after.file_bytes));
  row("FLOPs (dense)", 2.0 * double(r.before.macs), 2.0 * double(r.after.macs));
  row("FLOPs (non-zero)", 2.0 * double(r.before.sparse_macs), 2.0 * double(r.after.sparse_macs));
  for (const auto& n : r.notes) spdlog::debug("  {}", n);
  if (r.pattern == SparsityPattern::kChannel && config.sparse->round_to == 1 && r.channels_removed > 0)
    spdlog::info(
        "channel counts that are not multiples of 8 can run slower than the unpruned model in ONNX Runtime "
        "and TensorRT (docs/PRUNING.md); [sparse] round_to = 8 keeps them aligned");
  return r;
}

Model prepare_model(Model model, const Config& config, const Registry& registry, const std::string& calib,
                    Preparation* done) {
  auto mark = std::chrono::steady_clock::now();
  auto phase = [&](const char* name) {
    const auto now = std::chrono::steady_clock::now();
    if (done) done->phase_seconds.emplace_back(name, std::chrono::duration<double>(now - mark).count());
    mark = now;
  };
  if (config.sparse) {  // prune, then quantize the pruned model
    PruneResult pr = prune_step(model, config, registry, calib);
    if (done) done->pruning = static_cast<const PruneSummary&>(pr);
    model = std::move(pr.pruned);
    phase("prune");
  }
  if (bn_tuning_enabled(config)) {
    model = tune_batchnorm(model, config, registry, calib);
    phase("bn_tuning");
  }
  return model;
}

EvaluationResult evaluate(QuantModel& qm, const EvaluationRequest& request, const StepProgressFn& progress) {
  c10::InferenceMode guard;
  auto data = open_dataset(request.data, qm.graph().inputs);
  at::Tensor labels;
  if (!request.labels.empty()) labels = read_labels(request.labels);
  bool labels_checked = false;
  Batcher batcher(*data, qm.graph().inputs, std::max(qm.config().calibration.batch_size, 256), 0);
  const at::Device device(qm.config().calibration.device);
  std::int64_t n = 0, fp_correct = 0, q_correct = 0, agree = 0;
  double max_diff = 0;
  std::vector<at::Tensor> sim_outputs, fp_outputs;
  while (auto b = batcher.next()) {
    std::vector<at::Tensor> in;
    for (auto& t : b->inputs) in.push_back(t.to(device));
    qm.set_quant(false, false);
    at::Tensor fp = qm.forward(in)[0].to(at::kCPU);
    qm.set_quant(true, true);
    at::Tensor q = qm.forward(in)[0].to(at::kCPU);
    const std::int64_t rows = fp.size(0);
    if (!request.outputs.empty()) sim_outputs.push_back(q);
    if (!request.fp32_outputs.empty()) fp_outputs.push_back(fp);
    max_diff = std::max(max_diff, (fp - q).abs().max().item<double>());
    at::Tensor fp_top = fp.reshape({rows, -1}).argmax(1), q_top = q.reshape({rows, -1}).argmax(1);
    agree += (fp_top == q_top).sum().item<std::int64_t>();
    if (labels.defined()) {
      if (n + rows > labels.numel())
        throw Error(request.labels + ": has " + std::to_string(labels.numel()) +
                    " labels, fewer than the evaluation samples");
      at::Tensor y = labels.narrow(0, n, rows);
      if (!labels_checked) {  // the model's output fixes the classes
        labels_checked = true;
        const std::int64_t classes = fp.reshape({rows, -1}).size(1);
        const std::int64_t low = labels.min().item<std::int64_t>(), high = labels.max().item<std::int64_t>();
        if (low < 0 || high >= classes)
          spdlog::warn(
              "{}: labels run from {} to {}, outside the model's {} classes (0 to {}); the accuracy below "
              "means nothing unless the labels belong to this model and data",
              request.labels, low, high, classes, classes - 1);
      }
      fp_correct += (fp_top == y).sum().item<std::int64_t>();
      q_correct += (q_top == y).sum().item<std::int64_t>();
    }
    n += rows;
    if (progress) progress("evaluating", n, labels.defined() ? labels.numel() : -1, "");
  }
  end_step(progress);
  qm.set_quant(false, false);
  if (n == 0) throw Error("evaluation data " + request.data + " yielded no samples");
  if (!request.outputs.empty() && writes_outputs()) write_npy(at::cat(sim_outputs, 0), request.outputs);
  if (!request.fp32_outputs.empty() && writes_outputs()) write_npy(at::cat(fp_outputs, 0), request.fp32_outputs);
  EvaluationResult r;
  r.samples = n;
  r.top1_agreement = double(agree) / n;
  r.max_abs_output_diff = max_diff;
  if (labels.defined()) {
    r.fp32_accuracy = double(fp_correct) / n;
    r.simulated_accuracy = double(q_correct) / n;
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Jobs

namespace {
/// The config's file, when it came from one: an input no output may replace.
/// Gives `g` and the bodies of its control-flow nodes copies of their initializers.
void own_tensors(Graph& g) {
  for (auto& [name, t] : g.initializers) t = t.clone();
  for (Node* n : g.nodes())
    for (auto& [key, a] : n->attributes)
      if (a.kind == Attribute::Kind::kGraph && a.graph) own_tensors(*a.graph);
}

std::string config_file(const Config& c) {
  std::error_code ec;
  return fs::is_regular_file(c.source, ec) ? c.source : "";
}
}  // namespace

QuantizeOutcome run_quantize(const QuantizeJob& job, const StepProgressFn& progress) {
  const Config& config = job.config;
  if (config.target && !config.target->has_value)
    throw Error(
        "[target] sets no value: add target.value (e.g. metric = \"cosine\", value = 0.99) or pass --target "
        "\"cosine>=0.99\"");
  const EvaluationRequest eval = job.evaluation.value_or(EvaluationRequest{});
  check_distinct_paths({{"the model", job.model},
                        {"the config", config_file(config)},
                        {"calib", job.calib},
                        {"eval data", eval.data},
                        {"eval labels", eval.labels}},
                       {{"output", job.output, true},
                        {"report", job.report},
                        {"eval outputs", eval.outputs},
                        {"eval fp32 outputs", eval.fp32_outputs}});
  JobFiles files(job.output, job.report);
  init_distributed(config.calibration.device, [&] { return describe_run(job); });
  Registry registry;
  registry.load(config.plugins);
  QuantizeOutcome r;
  auto mark = std::chrono::steady_clock::now();
  auto phase = [&](const std::string& name) {  // closes the phase that ran since the last mark
    const auto now = std::chrono::steady_clock::now();
    r.phase_seconds.emplace_back(name, std::chrono::duration<double>(now - mark).count());
    mark = now;
  };
  Model model = load_float_model(job.model, registry, job.calib);
  r.import_ms = ms_since(mark);
  phase("load");
  Preparation prepared;
  model = prepare_model(std::move(model), config, registry, job.calib, &prepared);
  r.pruning = std::move(prepared.pruning);
  for (const auto& p : prepared.phase_seconds) r.phase_seconds.push_back(p);
  mark = std::chrono::steady_clock::now();
  if (config.target && config.target->metric == "top1-drop" && (!job.evaluation || job.evaluation->labels.empty()))
    throw Error("target " + config.target->describe() +
                " needs --eval-data and --eval-labels (top-1 accuracy on labelled data)");
  const std::int64_t holdout = config.target ? holdout_count(*config.target, job.calib, model.graph.inputs) : 0;
  const auto source = calibration_source(job.calib, model.graph.inputs, holdout);
  QuantModel qm(std::move(model), config, registry, source);
  warn_if_nothing_quantized(qm, config);
  phase("passes");
  if (config.target) {
    r.target = meet_target_step(qm, job, holdout, source, r.calibration, r.input_coverage, registry, progress);
    phase("calibration+target");
  } else {
    CoverageRecorder recorded(source(), qm.graph().inputs);
    r.calibration = calibrate(qm, recorded, config, progress);
    r.input_coverage = recorded.coverage();
    phase("calibration");
    // Parameters are computed at the end of calibration: shown as their own phase.
    r.phase_seconds.back().second -= r.calibration.parameter_seconds;
    r.phase_seconds.emplace_back("parameters", r.calibration.parameter_seconds);
  }
  log_coverage(r.input_coverage);
  if (config.weight_only) {
    // Weight-only runs read no data (and hold one copy of the weights): the float and
    // quantized forwards of the check would break both.
    spdlog::info("weight-only: no agreement check (bench/llm measures perplexity)");
  } else {
    r.agreement = check_agreement(qm, job, holdout);
    log_agreement(*r.agreement);
    phase("agreement");
  }
  r.quantized_inputs = qm.slots().size();
  r.quantization = qm.report(&r.calibration);
  if (job.evaluation) {
    r.evaluation = evaluate(qm, *job.evaluation, progress);
    phase("evaluation");
  }

  if (!writes_files()) return r;
  std::string external;
  files.set_model(qm.serialize(&external, files.external_location(), job.external_data));
  phase("export");
  r.external_data_written = files.commit(external, job.report.empty() ? "" : report_json(r));
  phase("write");
  spdlog::info("wrote {}", job.output);
  std::string times;
  for (const auto& [name, seconds] : r.phase_seconds)
    times += (times.empty() ? "" : ", ") + fmt::format("{} {:.2f} s", name, seconds);
  spdlog::debug("time per phase: {}", times);
  return r;
}

QatOutcome run_qat(const QatJob& job, const StepProgressFn& progress) {
  const Config& config = job.config;
  QatOutcome r;
  r.checkpoint = job.checkpoint.empty() ? job.output + ".ckpt" : job.checkpoint;
  check_distinct_paths(
      {{"the model", job.model}, {"the config", config_file(config)}, {"calib", job.calib}, {"train", job.train}},
      {{"output", job.output, true}, {"report", job.report}, {"checkpoint", r.checkpoint}});
  Distributed* group = init_distributed(config.calibration.device, [&] { return describe_run(job); });
  if (job.restart && writes_outputs()) fs::remove(r.checkpoint);
  if (group) group->barrier("starting from the checkpoint or from calibration");
  if (config.target)
    spdlog::warn("{}: [target] is for `sparsebit quantize`; QAT trains every layer instead", config.source);
  JobFiles files(job.output, job.report);
  Registry registry;
  registry.load(config.plugins);
  Model float_model = load_float_model(job.model, registry, job.calib);
  Executor teacher(float_model.graph, registry);
  teacher.to(config.calibration.device);
  Model student{float_model.graph.clone(), float_model.meta};
  own_tensors(student.graph);  // QAT trains them in place; the teacher keeps the originals
  Model qat_model = prepare_model(std::move(student), config, registry, job.calib);
  const auto qat_inputs = qat_model.graph.inputs;
  QuantModel qm(std::move(qat_model), config, registry, calibration_source(job.calib, qat_inputs, 0));
  const auto& inputs = qm.graph().inputs;
  {
    auto calib = open_dataset(job.calib, inputs);
    r.calibration = qm.init_qat(*calib, stage(progress, "calibrating"));
    end_step(progress);
  }
  spdlog::info("training {} epoch(s) on {} (batch {}, Adam lr {}, {} distillation loss, device {}, {} threads)",
               config.qat.epochs, job.train, config.qat.batch_size, config.qat.lr, config.qat.loss,
               config.calibration.device, at::get_num_threads());
  QatOptions options{config.qat, r.checkpoint, qat_fingerprint(job)};
  r.training = distill(
      qm, teacher, [&] { return open_dataset(job.train, inputs); }, options,
      epochs(progress, "epoch ", config.qat.epochs));
  end_step(progress);
  r.quantization = qm.report(&r.calibration);

  if (!writes_files()) return r;
  std::string external;
  files.set_model(qm.serialize(&external, files.external_location()));
  files.commit(external, job.report.empty() ? "" : report_json(r, job));
  spdlog::info("wrote {} (checkpoint {} kept: rerun with more --epochs to continue, --restart to start over)",
               job.output, r.checkpoint);
  return r;
}

PruneOutcome run_prune(const PruneJob& job, const StepProgressFn& progress) {
  Config config = job.config;
  if (!config.sparse)
    throw Error(config.source + ": no [sparse] table; add one, e.g. [sparse] sparser = \"l1_structured\", ratio = 0.5");
  PruneOutcome r;
  r.quantized = config.quantization_given;
  if (config.target && r.quantized)
    spdlog::warn("{}: [target] is for `sparsebit quantize`; quantize the pruned model with it", config.source);
  if (r.quantized && job.calib.empty())
    throw Error(config.source + " also quantizes ([w]/[a]): pass --calib with calibration data");
  if (job.finetune_epochs > 0 && job.train.empty()) throw Error("--finetune needs --train with training data");
  if (job.finetune_epochs > 0) config.qat.epochs = job.finetune_epochs;
  check_distinct_paths(
      {{"the model", job.model}, {"the config", config_file(config)}, {"calib", job.calib}, {"train", job.train}},
      {{"output", job.output, true}, {"report", job.report}, {"masked", job.masked}});
  JobFiles files(job.output, job.report, job.masked);
  init_distributed(config.calibration.device, [&] { return describe_run(job); });
  Registry registry;
  registry.load(config.plugins);
  Model model = load_and_lift(job.model, registry, job.calib);
  PruneResult pruned = prune_step(model, config, registry, job.calib);
  r.pruning = pruned;
  if (files.wants_masked() && writes_outputs())
    files.set_masked(serialize_onnx(pruned.masked.graph, pruned.masked.meta));

  const std::vector<ValueInfo> inputs = pruned.pruned.graph.inputs;  // a copy: the model moves below
  auto open_train = [&] { return open_dataset(job.train, inputs); };
  std::string bytes, external;
  if (r.quantized) {
    const auto inputs = pruned.pruned.graph.inputs;
    QuantModel qm(std::move(pruned.pruned), config, registry, calibration_source(job.calib, inputs, 0));
    if (job.finetune_epochs > 0) {
      auto calib = open_dataset(job.calib, inputs);
      r.calibration = qm.init_qat(*calib, stage(progress, "calibrating"));
      end_step(progress);
      // Zeros left by element / N:M pruning stay zero while training.
      std::vector<std::pair<at::Tensor, at::Tensor>> keep;
      for (const auto& [name, t] : qm.named_parameters())
        if (name.rfind("weight ", 0) == 0 && t.dim() >= 2 && (t == 0).any().item<bool>())
          keep.emplace_back(t, (t != 0).to(t.scalar_type()));
      Executor teacher(model.graph, registry);
      teacher.to(config.calibration.device);
      QatOptions options{config.qat, "", ""};
      options.after_step = [&] {
        c10::NoGradGuard no_grad;
        for (auto& [t, mask] : keep) t.mul_(mask);
      };
      const QatResult trained =
          distill(qm, teacher, open_train, options, epochs(progress, "fine-tuning ", config.qat.epochs));
      end_step(progress);
      for (const auto& e : trained.epochs) r.finetune_losses.push_back(e.loss);
      r.finetune_quantization_aware = true;
    } else {
      r.calibration = calibrate(qm, job.calib, config, progress);
    }
    r.quantization = qm.report(&*r.calibration);
    if (!writes_files()) return r;
    bytes = qm.serialize(&external, files.external_location());
  } else {
    if (job.finetune_epochs > 0) {
      r.finetune_losses = finetune(pruned.pruned, model, registry, open_train, config.qat, config.calibration.device,
                                   epochs(progress, "fine-tuning ", config.qat.epochs));
      end_step(progress);
    }
    if (!writes_files()) return r;
    bytes = serialize_onnx(pruned.pruned.graph, pruned.pruned.meta, {}, &external, files.external_location());
  }
  files.set_model(bytes);
  files.commit(external, job.report.empty() ? "" : report_json(r, job));
  spdlog::info("wrote {}{}", job.output, r.quantized ? " (pruned, then quantized)" : "");
  return r;
}

// ---------------------------------------------------------------------------------------------
// Reports

std::string report_json(const QuantizeOutcome& r) {
  json rep = quantization_report_value(r.quantization);
  rep["import_ms"] = r.import_ms;
  json phases = json::object();  // all but write, the phase that writes this report
  for (const auto& [name, seconds] : r.phase_seconds)
    if (name != "write") phases[name] = seconds;
  rep["phase_seconds"] = phases;
  if (r.pruning) rep["pruning"] = prune_report_value(*r.pruning);
  if (r.evaluation) {
    const EvaluationResult& e = *r.evaluation;
    json ev = {
        {"samples", e.samples}, {"top1_agreement", e.top1_agreement}, {"max_abs_output_diff", e.max_abs_output_diff}};
    if (e.fp32_accuracy) ev["fp32_accuracy"] = *e.fp32_accuracy;
    if (e.simulated_accuracy) ev["int8_simulated_accuracy"] = *e.simulated_accuracy;
    rep["evaluation"] = ev;
  }
  if (r.target) rep["target"] = json::parse(target_report_json(*r.target));
  if (r.agreement) {
    json outs = json::array();
    for (const auto& o : r.agreement->outputs)
      outs.push_back({{"output", o.name},
                      {"cosine", o.cosine},
                      {"sqnr_db", std::isfinite(o.sqnr_db) ? json(o.sqnr_db) : json(nullptr)}});
    rep["agreement"] = {{"samples", r.agreement->samples},
                        {"held_out", r.agreement->held_out},
                        {"poor", r.agreement->poor},
                        {"outputs", outs}};
  }
  json coverage = json::array();
  for (const auto& c : r.input_coverage)
    coverage.push_back({{"input", c.input}, {"min", c.min}, {"max", c.max}, {"open", c.open}});
  rep["input_coverage"] = coverage;
  return rep.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string report_json(const QatOutcome& r, const QatJob& job) {
  json rep = quantization_report_value(r.quantization);
  rep["qat"] = {{"resumed_after_epoch", r.training.resumed_after},
                {"checkpoint", r.checkpoint},
                {"loss", job.config.qat.loss},
                {"lr", job.config.qat.lr},
                {"epochs", json::array()}};
  for (const auto& e : r.training.epochs)
    rep["qat"]["epochs"].push_back({{"epoch", e.epoch},
                                    {"loss", e.loss},
                                    {"samples", e.samples},
                                    {"seconds", e.seconds},
                                    {"graphed_steps", e.graphed_steps}});
  return rep.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string report_json(const PruneOutcome& r, const PruneJob& job) {
  json rep = prune_report_value(r.pruning);
  rep["model"] = job.model;
  rep["config"] = job.config.source;
  if (job.finetune_epochs > 0) {
    if (r.finetune_quantization_aware) {
      rep["finetune"] = {{"epochs", json::array()}, {"quantization_aware", true}};
      for (std::size_t i = 0; i < r.finetune_losses.size(); ++i)
        rep["finetune"]["epochs"].push_back({{"epoch", static_cast<int>(i) + 1}, {"loss", r.finetune_losses[i]}});
    } else {
      rep["finetune"] = {{"epoch_loss", r.finetune_losses}, {"quantization_aware", false}};
    }
  }
  if (r.quantization) rep["quantization"] = quantization_report_value(*r.quantization);
  return rep.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sparsebit
