#include "sparsebit/core/pipeline.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

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

#include "base/digest.h"
#include "base/glob.h"
#include "base/log.h"
#include "pipeline/pipeline_steps.h"
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
#include "sparsebit/core/session.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace steps;

namespace {

/// Note [Distributed runs]: every process has finished its work (a failed one stops the others
/// here, before anything is written); true in the one process that writes the outputs.
bool writes_files() {
  if (Distributed* d = distributed()) d->barrier("finishing before rank 0 writes the outputs");
  return writes_outputs();
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
    if (side) logs::info("large initializers written to {}.data (ONNX external data)", model_path_);
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
  s << file_id(job.model) << "|" << file_id(c.source) << "|" << job.calib.identity() << "|" << job.train.identity()
    << "|" << c.qat.lr << "|" << c.qat.weight_decay << "|" << c.qat.batch_size << "|" << c.qat.count << "|"
    << c.qat.loss << "|" << c.qat.temperature << "|" << c.qat.seed << "|" << c.qat.tf32 << "|"
    << c.calibration.batch_size << "|" << c.calibration.count << "|" << c.calibration.mode;
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
                            const DataSource& calib) {
  JobDescription d{{"command", command},
                   {"model", file_identity(model)},
                   {"config", fmt::format("{:016x}", c.text_digest)},
                   {"calibration data", calib.empty() ? "(none)" : calib.name()},
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
  d.insert(d.end(), {{"training data", job.train.name()},
                     {"epochs", std::to_string(job.config.qat.epochs)},
                     {"learning rate", fmt::format("{}", job.config.qat.lr)},
                     {"loss", job.config.qat.loss},
                     {"restart", job.restart ? "yes" : "no"}});
  return d;
}

JobDescription describe_run(const PruneJob& job) {
  JobDescription d = describe_run("prune", job.model, job.config, job.calib);
  d.insert(d.end(), {{"training data", job.train.empty() ? "(none)" : job.train.name()},
                     {"fine-tuning epochs", std::to_string(job.finetune_epochs)}});
  return d;
}

}  // namespace

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

namespace {

/// Note [Float8 exports in ONNX Runtime]
/// An export with float8 Q/DQ (for TensorRT, Hopper and later) is valid ONNX, and ONNX Runtime's
/// CPU provider runs float8 QuantizeLinear/DequantizeLinear; but at its default optimization
/// level ('all') its QDQ fusions turn a float8 DQ -> Conv -> Q into QLinearConv, which takes no
/// float8, and loading fails ("Type 'tensor(float8e4m3fn)' of input parameter ... of operator
/// (QLinearConv) ... is invalid", ONNX Runtime 1.30). A placement that avoided that fusion would
/// change what TensorRT sees, so the export stays as TensorRT wants it and says how to check it
/// in ONNX Runtime: at graph optimization level 'basic' (tests/ort/run_model.mjs --optimization
/// basic; the check is in tests/integration/test_ort_float8.cpp).
std::string float8_load_note(const QuantModel& qm) {
  for (const auto& s : qm.slots())
    if (s.active() && s.spec.is_float8())
      return "the export has float8 Q/DQ: TensorRT runs it as written; ONNX Runtime loads it only at graph "
             "optimization level 'basic' (graphOptimizationLevel / GraphOptimizationLevel.ORT_ENABLE_BASIC), as its "
             "default level fuses float8 Q/DQ into integer kernels that take no float8";
  return "";
}

// Every data source of a job reads images as its config's [data] says (Note [Image data]).
QuantizeJob images_as_configured(QuantizeJob job) {
  job.calib = job.calib.with_images(job.config.data);
  if (job.evaluation) job.evaluation->data = job.evaluation->data.with_images(job.config.data);
  return job;
}
template <class Job>
Job images_as_configured(Job job) {
  job.calib = job.calib.with_images(job.config.data);
  job.train = job.train.with_images(job.config.data);
  return job;
}

}  // namespace

QuantizeOutcome run_quantize(const QuantizeJob& given, const StepProgressFn& progress) {
  const FilesReadScope run;  // Note [Files a run read]
  const QuantizeJob job = images_as_configured(given);
  const Config& config = job.config;
  if (config.target) check_target(config, job.evaluation ? &*job.evaluation : nullptr);  // before any work
  const EvaluationRequest eval = job.evaluation.value_or(EvaluationRequest{});
  check_distinct_paths({{"the model", job.model},
                        {"the config", config_file(config)},
                        {"calib", job.calib.path()},
                        {"eval data", eval.data.path()},
                        {"eval labels", eval.labels}},
                       {{"output", job.output, true},
                        {"report", job.report},
                        {"eval outputs", eval.outputs},
                        {"eval fp32 outputs", eval.fp32_outputs}});
  JobFiles files(job.output, job.report);
  init_distributed(config.calibration.device, [&] { return describe_run(job); });
  const Session session(config);
  QuantizeOutcome r;
  auto mark = std::chrono::steady_clock::now();
  auto phase = [&](const std::string& name) {  // closes the phase that ran since the last mark
    const auto now = std::chrono::steady_clock::now();
    r.phase_seconds.emplace_back(name, std::chrono::duration<double>(now - mark).count());
    mark = now;
  };
  Model model = session.load(job.model, job.calib);
  r.import_ms = ms_since(mark);
  phase("load");
  Preparation prepared;
  model = session.prepare(std::move(model), job.calib, &prepared);
  r.pruning = std::move(prepared.pruning);
  for (const auto& p : prepared.phase_seconds) r.phase_seconds.push_back(p);
  mark = std::chrono::steady_clock::now();
  const std::int64_t holdout = session.target_holdout(job.calib, model);
  const DataSource source = session.calibration_samples(job.calib, holdout);
  QuantModel qm = session.quant_model(std::move(model), source);
  warn_if_nothing_quantized(qm, config);
  phase("passes");
  if (config.target) {
    r.target = session.meet_target(qm, job.calib, holdout, r.calibration, &r.input_coverage,
                                   job.evaluation ? &*job.evaluation : nullptr, progress);
    phase("calibration+target");
  } else {
    r.calibration = session.calibrate(qm, source, progress, &r.input_coverage);
    phase("calibration");
    // Parameters are computed at the end of calibration: shown as their own phase.
    r.phase_seconds.back().second -= r.calibration.parameter_seconds;
    r.phase_seconds.emplace_back("parameters", r.calibration.parameter_seconds);
    if (config.weight_only && !steps::weight_solver(config).empty()) {
      r.rounding_check = session.check_against_rounding(qm, session.load(job.model, job.calib), source);
      if (r.rounding_check) phase("rounding check");
    }
  }
  log_coverage(r.input_coverage);
  r.latency_search = session.search_latency(qm, job.model, job.calib);
  if (r.latency_search && r.latency_search->ran) phase("latency search");
  if (config.weight_only) {
    // Weight-only runs read no data (and hold one copy of the weights): the float and
    // quantized forwards of the check would break both.
    logs::info("weight-only: no agreement check (bench/llm measures perplexity)");
  } else {
    r.agreement = session.check_agreement(qm, job.calib, holdout);
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
  std::string bytes = session.export_onnx(qm, &external, files.external_location(), job.external_data);
  phase("export");
  r.latency = session.time_export(job.model, bytes, external, qm, job.calib);
  if (r.latency && r.latency->measured) phase("latency");
  if (const std::string note = float8_load_note(qm); !note.empty()) {
    logs::warn("{}", note);
    r.notes.push_back(note);
  }
  files.set_model(std::move(bytes));
  r.external_data_written = files.commit(external, job.report.empty() ? "" : report_json(r));
  phase("write");
  logs::info("wrote {}", displayed(job.output));
  std::string times;
  for (const auto& [name, seconds] : r.phase_seconds)
    times += (times.empty() ? "" : ", ") + fmt::format("{} {:.2f} s", name, seconds);
  logs::debug("time per phase: {}", times);
  return r;
}

QatOutcome run_qat(const QatJob& given, const StepProgressFn& progress) {
  const FilesReadScope run;  // Note [Files a run read]
  const QatJob job = images_as_configured(given);
  const Config& config = job.config;
  QatOutcome r;
  r.checkpoint = job.checkpoint.empty() ? job.output + ".ckpt" : job.checkpoint;
  check_distinct_paths({{"the model", job.model},
                        {"the config", config_file(config)},
                        {"calib", job.calib.path()},
                        {"train", job.train.path()}},
                       {{"output", job.output, true}, {"report", job.report}, {"checkpoint", r.checkpoint}});
  Distributed* group = init_distributed(config.calibration.device, [&] { return describe_run(job); });
  if (job.restart && writes_outputs()) fs::remove(r.checkpoint);
  if (group) group->barrier("starting from the checkpoint or from calibration");
  if (config.target)
    logs::warn("{}: [target] is for `sparsebit quantize`; QAT trains every layer instead", config.source);
  JobFiles files(job.output, job.report);
  const Session session(config);
  const Registry& registry = session.registry();
  Model float_model = session.load(job.model, job.calib);
  Executor teacher(float_model.graph, registry);
  teacher.to(config.calibration.device);
  Model student{float_model.graph.clone(), float_model.meta};
  own_tensors(student.graph);  // QAT trains them in place; the teacher keeps the originals
  QuantModel qm = session.quant_model(session.prepare(std::move(student), job.calib), job.calib);
  const auto& inputs = qm.graph().inputs;
  r.calibration = session.init_qat(qm, job.calib, progress);
  logs::info("training {} epoch(s) on {} (batch {}, Adam lr {}, {} distillation loss, device {}, {} threads)",
             config.qat.epochs, job.train.name(), config.qat.batch_size, config.qat.lr, config.qat.loss,
             config.calibration.device, at::get_num_threads());
  QatOptions options{config.qat, r.checkpoint, qat_fingerprint(job)};
  r.training = distill(
      qm, teacher, [&] { return job.train.open(inputs); }, options, epochs(progress, "epoch ", config.qat.epochs));
  end_step(progress);
  r.quantization = qm.report(&r.calibration);

  if (!writes_files()) return r;
  std::string external;
  files.set_model(qm.serialize(&external, files.external_location()));
  files.commit(external, job.report.empty() ? "" : report_json(r, job));
  logs::info("wrote {} (checkpoint {} kept: rerun with more --epochs to continue, --restart to start over)",
             displayed(job.output), displayed(r.checkpoint));
  return r;
}

PruneOutcome run_prune(const PruneJob& given, const StepProgressFn& progress) {
  const FilesReadScope run;  // Note [Files a run read]
  const PruneJob job = images_as_configured(given);
  Config config = job.config;
  if (!config.sparse)
    throw Error(config.source + ": no [sparse] table; add one, e.g. [sparse] sparser = \"l1_structured\", ratio = 0.5");
  PruneOutcome r;
  r.quantized = config.quantization_given;
  if (config.target && r.quantized)
    logs::warn("{}: [target] is for `sparsebit quantize`; quantize the pruned model with it", config.source);
  if (r.quantized && job.calib.empty())
    throw Error(config.source + " also quantizes ([w]/[a]): pass --calib with calibration data");
  if (job.finetune_epochs > 0 && job.train.empty()) throw Error("--finetune needs --train with training data");
  if (job.finetune_epochs > 0) config.qat.epochs = job.finetune_epochs;
  check_distinct_paths({{"the model", job.model},
                        {"the config", config_file(config)},
                        {"calib", job.calib.path()},
                        {"train", job.train.path()}},
                       {{"output", job.output, true}, {"report", job.report}, {"masked", job.masked}});
  JobFiles files(job.output, job.report, job.masked);
  init_distributed(config.calibration.device, [&] { return describe_run(job); });
  const Session session(config);
  const Registry& registry = session.registry();
  Model model = load_and_lift(job.model, registry, job.calib);
  PruneResult pruned = prune_step(model, config, registry, job.calib);
  r.pruning = pruned;
  if (files.wants_masked() && writes_outputs())
    files.set_masked(serialize_onnx(pruned.masked.graph, pruned.masked.meta));

  const std::vector<ValueInfo> inputs = pruned.pruned.graph.inputs;  // a copy: the model moves below
  auto open_train = [&] { return job.train.open(inputs); };
  std::string bytes, external;
  if (r.quantized) {
    QuantModel qm = session.quant_model(std::move(pruned.pruned), job.calib);
    if (job.finetune_epochs > 0) {
      r.calibration = session.init_qat(qm, job.calib, progress);
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
      r.calibration = session.calibrate(qm, job.calib, progress);
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
  logs::info("wrote {}{}", displayed(job.output), r.quantized ? " (pruned, then quantized)" : "");
  return r;
}

}  // namespace sparsebit
