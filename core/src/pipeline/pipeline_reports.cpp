// The JSON reports the jobs write (pipeline.h), made from their typed outcomes.

#include <nlohmann/json.hpp>

#include "prune/prune_report_value.h"
#include "quant/quant_report_value.h"
#include "sparsebit/core/pipeline.h"

namespace sparsebit {

using nlohmann::json;

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
  if (!r.notes.empty()) rep["notes"] = r.notes;
  if (r.agreement) {
    json outs = json::array();
    for (const auto& o : r.agreement->outputs)
      outs.push_back({{"output", o.name},
                      {"cosine", std::isnan(o.cosine) ? json(nullptr) : json(o.cosine)},
                      {"sqnr_db", std::isfinite(o.sqnr_db) ? json(o.sqnr_db) : json(nullptr)},
                      {"not_finite_float", o.not_finite_float},
                      {"not_finite_quantized", o.not_finite_quantized}});
    rep["agreement"] = {{"samples", r.agreement->samples},
                        {"held_out", r.agreement->held_out},
                        {"poor", r.agreement->poor},
                        {"outputs", outs}};
  }
  if (r.rounding_check) {  // Note [Solved weights against rounding]
    const RoundingCheck& c = *r.rounding_check;
    rep["rounding_check"] = {{"solver", c.solver},
                             {"loss", c.loss},
                             {"samples", c.samples},
                             {"held_out", c.held_out},
                             {"solved", c.solved},
                             {"rounded", c.rounded},
                             {"standard_error", c.standard_error},
                             {"kept_solved", c.kept_solved}};
  }
  if (r.latency) {  // Note [Latency step]
    json rows = json::array();
    for (const auto& row : r.latency->rows)
      rows.push_back({{"threads", row.threads},
                      {"float_ms", row.float_ms},
                      {"export_ms", row.export_ms},
                      {"speedup", row.float_ms / row.export_ms}});
    rep["latency"] = {{"measured", r.latency->measured},
                      {"runtime", r.latency->measured ? "onnxruntime-node " + r.latency->runtime : ""},
                      {"why_not", r.latency->why_not},
                      {"float_bytes", r.latency->float_bytes},
                      {"export_bytes", r.latency->export_bytes},
                      {"rows", rows}};
  }
  if (r.latency_search) {  // Note [Latency search]
    const LatencySearch& ls = *r.latency_search;
    json regions = json::array();
    for (const auto& region : ls.timed)
      regions.push_back({{"nodes", region.nodes},
                         {"made_float", region.made_float},
                         {"speedup_as_float", region.speedup_as_float},
                         {"rounds_faster_as_float", region.rounds_faster_as_float}});
    rep["latency"]["search"] = {{"ran", ls.ran},
                                {"why_not", ls.why_not},
                                {"regions", ls.regions},
                                {"threads", ls.threads},
                                {"runs", ls.runs},
                                {"timed", regions},
                                {"speedup_together", ls.speedup_together},
                                {"reverted", ls.reverted},
                                {"seconds", ls.seconds}};
  }
  // Which of the two searches kept each float layer float.
  json kept_float = json::array();
  if (r.target)
    for (const auto& l : r.target->fallback_layers)
      if (l.remedy == "float") kept_float.push_back({{"node", l.node}, {"why", "accuracy"}});
  if (r.latency_search)
    for (const auto& region : r.latency_search->timed)
      if (region.made_float)
        for (const auto& n : region.nodes) kept_float.push_back({{"node", n}, {"why", "latency"}});
  if (r.target || r.latency_search) rep["kept_float"] = kept_float;
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
