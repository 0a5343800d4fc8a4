// The steps of a job (pipeline_steps.h) and the public ones of pipeline.h: loading, pruning,
// preparing, evaluating.

#include "pipeline/pipeline_steps.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include "base/glob.h"
#include "base/log.h"
#include "sparsebit/core/bn_tuning.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace steps {

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
  logs::debug(
      "calibration time by op type: {:.2f} s in ops, {:.2f} s observing/quantizing their inputs, "
      "{:.2f} s elsewhere (data loading, parameters)",
      ops, hooks, std::max(0.0, total - ops - hooks));
  logs::debug("  {:<24} {:>7} {:>10} {:>12} {:>6}", "op", "calls", "op s", "inputs s", "share");
  for (const auto& [op, t] : rows)
    logs::debug("  {:<24} {:>7} {:>10.3f} {:>12.3f} {:>5.1f}%", op, t.calls, t.seconds, t.hook_seconds,
                total > 0 ? 100 * (t.seconds + t.hook_seconds) / total : 0.0);
}

/// Calibrates the QuantModel on `data`, logging what it does.
CalibrationStats calibrate(QuantModel& qm, Dataset& data, const Config& config, const StepProgressFn& progress) {
  logs::info("calibrating on {} ({} samples max, batch {}, {} mode, device {}, {} threads)", data.describe(),
             config.calibration.count > 0 ? std::to_string(config.calibration.count) : std::string("all"),
             config.calibration.batch_size, config.calibration.mode, config.calibration.device, at::get_num_threads());
  const bool timing = logs::debug_enabled();
  qm.executor().reset_op_times();
  qm.executor().set_op_timing(timing);
  CalibrationStats stats = qm.calibrate(data, stage(progress, "calibrating"));
  qm.executor().set_op_timing(false);
  end_step(progress);
  if (stats.samples == 0)  // weight-only, streaming: nothing needed the data
    logs::info("calibrated {} quantized weights in {:.2f} s", qm.slots().size(), stats.seconds);
  else
    logs::info("calibrated {} quantized inputs on {} samples in {:.2f} s", qm.slots().size(), stats.samples,
               stats.seconds);
  if (stats.range_selected_inputs > 0) {  // Note [Choosing ranges by the consuming layer]
    std::string chosen;
    for (const auto& [name, n] : stats.range_choices)
      chosen += (chosen.empty() ? "" : ", ") + name + " " + std::to_string(n);
    logs::info("  ranges chosen by their layer's error on {} samples for {} inputs in {:.2f} s: {}",
               stats.range_selection_samples, stats.range_selected_inputs, stats.range_selection_seconds, chosen);
    // Note [Choices judged at the output]
    if (stats.range_departures > 0 && stats.range_judged_samples == 0)
      logs::info(
          "  {} inputs whose layer preferred another range keep their observer's own: no held-out "
          "samples to judge them on (the calibration data has no more than [calibration] range_samples)",
          stats.range_departures);
    else if (stats.range_departures > 0)
      logs::info(
          "  judged at the model's output on {} held-out samples: {} of {} inputs keep their layer's "
          "choice over their observer's own range (output error {:.3g} -> {:.3g})",
          stats.range_judged_samples, stats.range_kept_departures, stats.range_departures,
          stats.range_output_error_default, stats.range_output_error_kept);
  }
  if (timing) {
    log_op_times(qm.executor().op_times(), stats.seconds);
    const CpuCacheStats c = caching_cpu_allocator_stats();
    if (c.hits + c.misses > 0)
      logs::debug("large CPU blocks (Note [Caching CPU allocator]): {} reused, {} mapped, {:.0f} MiB cached now",
                  c.hits, c.misses, double(c.cached_bytes) / (1 << 20));
  }
  return stats;
}

void allocate_bits(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress) {
  if (!qm.config().bit_allocation) return;
  const BitAllocation& b = qm.allocate_bits(calib, stage(progress, "allocating bits"));
  end_step(progress);
  auto line = [&](const char* what, const std::optional<double>& target, double reached, InputRole role) {
    if (!target) return;
    std::map<int, int> count;
    for (const auto& in : b.inputs)
      if (in.role == role) ++count[in.bits];
    std::string widths;
    for (const auto& [bits, n] : count)
      widths += (widths.empty() ? "" : ", ") + std::to_string(n) + " at " + std::to_string(bits);
    logs::info("bit allocation: {} average {:.2f} bits (budget {:.2f}): {}", what, reached, *target, widths);
  };
  line("weights", b.weight_target, b.weight_average, InputRole::kWeight);
  line("activations", b.activation_target, b.activation_average, InputRole::kActivation);
  logs::info("bit allocation: sensitivities of {} inputs at {} widths on {} samples in {:.2f} s", b.inputs.size(),
             b.choices.size(), b.samples, b.seconds);
}

CalibrationStats calibrate(QuantModel& qm, const DataSource& calib, const Config& config,
                           const StepProgressFn& progress) {
  auto data = calib.open(qm.graph().inputs);
  return calibrate(qm, *data, config, progress);
}

/// How many calibration samples the accuracy target keeps apart (Note [Accuracy target]): as
/// asked, or a quarter of a set smaller than twice that; 0 measures on calibration samples.
std::int64_t holdout_count(const TargetConfig& t, const DataSource& calib, const std::vector<ValueInfo>& inputs) {
  std::int64_t h = t.holdout;
  if (h == 0) return 0;
  auto data = calib.open(inputs);
  std::optional<std::int64_t> n = data->num_samples();
  if (!n) {  // unknown without reading (a file may hold a batch): count up to what matters
    Batcher count(*data, inputs, 2 * h, 2 * h);
    while (count.next()) {
    }
    n = count.samples_delivered();
  }
  if (*n < 2 * h) {
    h = *n / 4;
    logs::info(
        "target: {} has {} samples; {} are kept apart to measure {} (with so few, [target] holdout = 0 measures on "
        "the calibration samples and keeps them all for the ranges)",
        calib.name(), *n, h, t.metric);
  }
  return h;
}

void check_target(const Config& config, const EvaluationRequest* eval) {
  const TargetConfig& t = *config.target;
  if (!t.has_value)
    throw Error(
        "[target] sets no value: add target.value (e.g. metric = \"cosine\", value = 0.99) or pass --target "
        "\"cosine>=0.99\"");
  if (config.bit_allocation)
    throw Error(config.source +
                ": [bit_allocation] and an accuracy target ([target] or --target) both choose "
                "layers' precision; use one of them");
  if (t.metric == "top1-drop" && (!eval || eval->labels.empty()))
    throw Error("target " + t.describe() + " needs --eval-data and --eval-labels (top-1 accuracy on labelled data)");
}

/// The calibration samples: all of them, or all but the first `holdout`.
DataSource calibration_source(const DataSource& calib, std::int64_t holdout) {
  if (holdout == 0) return calib;
  return DataSource(calib.name() + " after the first " + std::to_string(holdout) + " samples",
                    [calib, holdout](const std::vector<ValueInfo>& inputs) -> std::unique_ptr<Dataset> {
                      return std::make_unique<SampleWindow>(calib.open(inputs), inputs, holdout, 0);
                    });
}

/// Calibrates on all but the held-out samples, then meets the target.
TargetReport meet_target_step(QuantModel& qm, const Config& config, const DataSource& calib,
                              const EvaluationRequest* eval, std::int64_t holdout, const DataSource& calibration,
                              CalibrationStats& stats, std::vector<InputCoverage>& coverage, const Registry& registry,
                              const StepProgressFn& progress) {
  const TargetConfig& t = *config.target;
  const auto& inputs = qm.graph().inputs;
  {
    CoverageRecorder recorded(calibration.open(inputs), inputs);
    stats = calibrate(qm, recorded, config, progress);
    coverage = recorded.coverage();
  }
  TargetData data;
  const std::int64_t measured = holdout > 0 ? holdout : 16;
  SampleWindow held(calib.open(inputs), inputs, 0, measured);
  const at::Device device(config.calibration.device);
  Batcher one(held, inputs, 1, 0);
  while (auto b = one.next()) {
    for (auto& x : b->inputs) x = x.to(device);
    data.holdout.push_back(std::move(b->inputs));
  }
  data.holdout_description = std::to_string(data.holdout.size()) +
                             (holdout > 0 ? " held-out calibration samples" : " calibration samples (no holdout)");
  data.calibration = calibration;
  if (t.metric == "top1-drop") {
    auto samples = eval->data.open(inputs);
    Batcher batches(*samples, inputs, std::max(config.calibration.batch_size, 256), 0);
    while (auto b = batches.next()) {
      for (auto& x : b->inputs) x = x.to(device);
      data.eval.push_back(std::move(b->inputs));
    }
    data.eval_labels = read_labels(eval->labels);
    data.eval_description = eval->data.name();
  }
  if (const auto* histogram = registry.observer("auto")) data.range_observer = histogram->factory;
  logs::info("target {}: measuring on {}", t.describe(), data.holdout_description);
  TargetReport r = meet_target(qm, t, data, stage(progress, "measuring layers"));
  end_step(progress);
  std::string remedies;
  std::size_t costly = 0;
  for (const auto& [name, n] : r.remedies) {
    remedies += (remedies.empty() ? "" : ", ") + name + " " + std::to_string(n);
    if (name == "int16" || name == "float") costly += n;
  }
  logs::info(
      "target {}: {} {:.6g} with every layer quantized, {:.6g} with {} of {} layers remedied{} ({} "
      "evaluations, {:.1f} s)",
      t.describe(), t.metric, r.before, r.after, r.fallback_layers.size(), r.quantized_layers,
      remedies.empty() ? "" : " (" + remedies + ")", r.evaluations, r.seconds);
  for (const auto& l : r.fallback_layers)
    logs::info("  {} {} ({}): layer SQNR {:.1f} -> {:.1f} dB", l.remedy, l.node, l.op_type, l.sqnr_db,
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
    logs::warn("{}; writing the best model found", missed);
  }
  return r;
}

}  // namespace steps

using namespace steps;

// ---------------------------------------------------------------------------------------------
// Steps

Model load_float_model(const std::string& path, const Registry& registry, const DataSource& calib) {
  Model model = load_and_lift(path, registry, calib);
  // Quantizing a QDQ model again would put a second set of quantizers around the first, which
  // no backend deploys as meant.
  const std::size_t qdq = count_qdq_nodes(model.graph);
  if (qdq > 0)
    throw Error(path + " is already quantized (" + std::to_string(qdq) +
                " QuantizeLinear/DequantizeLinear nodes); quantize its float original instead");
  return model;
}

PruneResult prune_step(const Model& model, const Config& config, const Registry& registry, const DataSource& calib) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Dataset> data;  // for bias compensation
  if (!calib.empty()) data = calib.open(model.graph.inputs);
  PruneResult r = prune(model, config, registry, sample_inputs(model.graph, calib), data.get());
  const double seconds = ms_since(t0) / 1000;
  std::string what = r.pattern == SparsityPattern::kChannel
                         ? std::to_string(r.channels_removed) + " channels removed in " +
                               std::to_string(r.groups_pruned) + " of " + std::to_string(r.groups) + " channel groups"
                     : r.pattern == SparsityPattern::kNM ? std::to_string(r.n) + ":" + std::to_string(r.m) + " sparsity"
                                                         : "unstructured sparsity";
  logs::info("pruned with '{}' in {:.2f} s: {}{}", r.sparser, seconds, what,
             r.bias_compensated ? ", " + std::to_string(r.bias_compensated) + " biases compensated" : std::string());
  logs::info("  {:<20} {:>12} {:>12} {:>8}", "", "before", "after", "ratio");
  auto row = [](const char* name, double before, double after) {
    logs::info("  {:<20} {:>12} {:>12} {:>7.3f}", name, human(before), human(after), before > 0 ? after / before : 0.0);
  };
  row("parameters", double(r.before.parameters), double(r.after.parameters));
  row("non-zero parameters", double(r.before.nonzero_parameters), double(r.after.nonzero_parameters));
  row("file bytes", double(r.before.file_bytes), double(r.after.file_bytes));
  row("FLOPs (dense)", 2.0 * double(r.before.macs), 2.0 * double(r.after.macs));
  row("FLOPs (non-zero)", 2.0 * double(r.before.sparse_macs), 2.0 * double(r.after.sparse_macs));
  for (const auto& n : r.notes) logs::debug("  {}", n);
  if (r.pattern == SparsityPattern::kChannel && config.sparse->round_to == 1 && r.channels_removed > 0)
    logs::info(
        "channel counts that are not multiples of 8 can run slower than the unpruned model in ONNX Runtime "
        "and TensorRT (docs/PRUNING.md); [sparse] round_to = 8 keeps them aligned");
  return r;
}

Model prepare_model(Model model, const Config& config, const Registry& registry, const DataSource& calib,
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
  auto data = request.data.open(qm.graph().inputs);
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
          logs::warn(
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
  if (n == 0) throw Error("evaluation data " + request.data.name() + " yielded no samples");
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

}  // namespace sparsebit
