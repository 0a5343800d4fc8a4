// The steps of a job (pipeline_steps.h) and the public ones of pipeline.h: loading, pruning,
// preparing, evaluating.

#include "pipeline/pipeline_steps.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include "base/glob.h"
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
  spdlog::debug(
      "calibration time by op type: {:.2f} s in ops, {:.2f} s observing/quantizing their inputs, "
      "{:.2f} s elsewhere (data loading, parameters)",
      ops, hooks, std::max(0.0, total - ops - hooks));
  spdlog::debug("  {:<24} {:>7} {:>10} {:>12} {:>6}", "op", "calls", "op s", "inputs s", "share");
  for (const auto& [op, t] : rows)
    spdlog::debug("  {:<24} {:>7} {:>10.3f} {:>12.3f} {:>5.1f}%", op, t.calls, t.seconds, t.hook_seconds,
                  total > 0 ? 100 * (t.seconds + t.hook_seconds) / total : 0.0);
}

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
    auto probe = job.calib.open(inputs);
    const auto n = probe->num_samples();
    if (n && *n > config.calibration.count) first = config.calibration.count, r.held_out = true;
  }
  const std::int64_t take = target_holdout > 0 ? std::min(kSamples, target_holdout) : kSamples;
  SampleWindow window(job.calib.open(inputs), inputs, first, take);
  Batcher batches(window, inputs,
                  std::max<std::int64_t>(1, std::min<std::int64_t>(config.calibration.batch_size, take)), take);
  const at::Device device(config.calibration.device);
  const auto& outs = qm.graph().outputs;
  std::vector<double> ff(outs.size(), 0), qq(outs.size(), 0), fq(outs.size(), 0), ee(outs.size(), 0);
  std::vector<std::int64_t> elements(outs.size(), 0), bad_float(outs.size(), 0), bad_quantized(outs.size(), 0);
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
      // Scored where both are finite; a NaN or infinity counted, never zeroed into agreement.
      const at::Tensor finite_f = at::isfinite(f[i]), finite_q = at::isfinite(q[i]), both = finite_f & finite_q;
      elements[i] += f[i].numel();
      bad_float[i] += f[i].numel() - finite_f.sum().item<std::int64_t>();
      bad_quantized[i] += (finite_f & finite_q.logical_not()).sum().item<std::int64_t>();
      const at::Tensor a = f[i].to(at::kDouble).masked_fill(both.logical_not(), 0),
                       c = q[i].to(at::kDouble).masked_fill(both.logical_not(), 0);
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
    o.elements = elements[i];
    o.not_finite_float = bad_float[i];
    o.not_finite_quantized = bad_quantized[i];
    if (o.not_finite_float + o.not_finite_quantized >= o.elements) {  // nothing left to compare
      o.cosine = o.sqnr_db = std::numeric_limits<double>::quiet_NaN();
    } else {
      o.cosine = ff[i] > 0 && qq[i] > 0 ? fq[i] / std::sqrt(ff[i] * qq[i]) : (ee[i] == 0 ? 1.0 : 0.0);
      o.sqnr_db =
          ee[i] > 0 ? 10 * std::log10(std::max(ff[i], 1e-300) / ee[i]) : std::numeric_limits<double>::infinity();
    }
    r.poor = r.poor || !(o.cosine >= AgreementCheck::kPoorCosine) || o.not_finite_quantized > 0;
    r.outputs.push_back(o);
  }
  return r;
}

void log_agreement(const AgreementCheck& a) {
  const std::string on = std::to_string(a.samples) + (a.held_out ? " held-out samples" : " calibration samples");
  for (const auto& o : a.outputs) {
    if (std::isnan(o.cosine))
      spdlog::warn(
          "quantized vs float on {}: output '{}' is NaN or infinite on every element ({} in float, {} "
          "quantized only): no agreement can be measured; check that the data is what the model expects",
          on, o.name, o.not_finite_float, o.not_finite_quantized);
    else
      spdlog::info("quantized vs float on {}: output '{}' cosine {:.4f}, SQNR {:.1f} dB", on, o.name, o.cosine,
                   o.sqnr_db);
    if (!std::isnan(o.cosine) && o.not_finite_float > 0)
      spdlog::warn(
          "output '{}' of the float model is NaN or infinite at {} of its {} values on {}; the agreement "
          "above leaves them out",
          o.name, o.not_finite_float, o.elements, on);
    if (!std::isnan(o.cosine) && o.not_finite_quantized > 0)
      spdlog::warn(
          "output '{}' of the quantized model is NaN or infinite at {} of its {} values on {} where the "
          "float model's is finite: a layer overflows its quantized range (`sparsebit profile` names it)",
          o.name, o.not_finite_quantized, o.elements, on);
  }
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
  for (const Node* n : qm.graph().nodes()) skipped += node_matches_any(n->name, config.skip);
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
    // Note [Choices judged at the output]
    if (stats.range_departures > 0 && stats.range_judged_samples == 0)
      spdlog::info(
          "  {} inputs whose layer preferred another range keep their observer's own: no held-out "
          "samples to judge them on (the calibration data has no more than [calibration] range_samples)",
          stats.range_departures);
    else if (stats.range_departures > 0)
      spdlog::info(
          "  judged at the model's output on {} held-out samples: {} of {} inputs keep their layer's "
          "choice over their observer's own range (output error {:.3g} -> {:.3g})",
          stats.range_judged_samples, stats.range_kept_departures, stats.range_departures,
          stats.range_output_error_default, stats.range_output_error_kept);
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
    spdlog::info("bit allocation: {} average {:.2f} bits (budget {:.2f}): {}", what, reached, *target, widths);
  };
  line("weights", b.weight_target, b.weight_average, InputRole::kWeight);
  line("activations", b.activation_target, b.activation_average, InputRole::kActivation);
  spdlog::info("bit allocation: sensitivities of {} inputs at {} widths on {} samples in {:.2f} s", b.inputs.size(),
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
    spdlog::info(
        "target: {} has {} samples; {} are kept apart to measure {} (with so few, [target] holdout = 0 measures on "
        "the calibration samples and keeps them all for the ranges)",
        calib.name(), *n, h, t.metric);
  }
  return h;
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
TargetReport meet_target_step(QuantModel& qm, const QuantizeJob& job, std::int64_t holdout,
                              const DataSource& calibration, CalibrationStats& stats,
                              std::vector<InputCoverage>& coverage, const Registry& registry,
                              const StepProgressFn& progress) {
  const TargetConfig& t = *job.config.target;
  const auto& inputs = qm.graph().inputs;
  {
    CoverageRecorder recorded(calibration.open(inputs), inputs);
    stats = calibrate(qm, recorded, job.config, progress);
    coverage = recorded.coverage();
  }
  TargetData data;
  const std::int64_t measured = holdout > 0 ? holdout : 16;
  SampleWindow held(job.calib.open(inputs), inputs, 0, measured);
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
    auto eval = job.evaluation->data.open(inputs);
    Batcher batches(*eval, inputs, std::max(job.config.calibration.batch_size, 256), 0);
    while (auto b = batches.next()) {
      for (auto& x : b->inputs) x = x.to(device);
      data.eval.push_back(std::move(b->inputs));
    }
    data.eval_labels = read_labels(job.evaluation->labels);
    data.eval_description = job.evaluation->data.name();
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
