#include "sparsebit/core/session.h"

#include "base/log.h"
#include "pipeline_steps.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

Session::Session(Config config) : config_(std::move(config)), registry_(std::make_unique<Registry>()) {
  registry_->load(config_.plugins);
}

Session::~Session() = default;

std::vector<ScheduleEntry> Session::schedule() const { return resolve_schedule(config_, *registry_); }

Model Session::load(const std::string& path, const DataSource& calib) const {
  return load_float_model(path, *registry_, calib.with_images(config_.data));
}

Model Session::read(const std::string& path, int lift_to) const {
  return load_onnx(path, ImportOptions{lift_to, registry_.get()});
}

Model Session::prepare(Model model, const DataSource& calib, Preparation* done) const {
  return prepare_model(std::move(model), config_, *registry_, calib.with_images(config_.data), done);
}

void Session::simplify(Model& model) const {
  run_passes(schedule(), Pass::Stage::kSimplify, model.graph, *registry_, nullptr, config_.source);
}

QuantModel Session::quant_model(Model model, const DataSource& calib) const {
  return QuantModel(std::move(model), config_, *registry_, calib.with_images(config_.data));
}

CalibrationStats Session::calibrate(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress,
                                    std::vector<InputCoverage>* coverage) const {
  const DataSource source = calib.with_images(config_.data);
  steps::allocate_bits(qm, source, progress);
  if (!coverage) return steps::calibrate(qm, source, config_, progress);
  steps::CoverageRecorder recorded(source.open(qm.graph().inputs), qm.graph().inputs);
  CalibrationStats stats = steps::calibrate(qm, recorded, config_, progress);
  *coverage = recorded.coverage();
  return stats;
}

std::int64_t Session::target_holdout(const DataSource& calib, const Model& model) const {
  if (!config_.target) return 0;
  return steps::holdout_count(*config_.target, calib.with_images(config_.data), model.graph.inputs);
}

DataSource Session::calibration_samples(const DataSource& calib, std::int64_t holdout) const {
  return steps::calibration_source(calib.with_images(config_.data), holdout);
}

TargetReport Session::meet_target(QuantModel& qm, const DataSource& calib, std::int64_t holdout,
                                  CalibrationStats& stats, std::vector<InputCoverage>* coverage,
                                  const EvaluationRequest* eval, const StepProgressFn& progress) const {
  if (!config_.target) throw Error(config_.source + ": meet_target() needs a [target] table (or --target)");
  steps::check_target(config_, eval);
  const DataSource source = calib.with_images(config_.data);
  std::optional<EvaluationRequest> labelled;
  if (eval) labelled = EvaluationRequest{eval->data.with_images(config_.data), eval->labels, "", ""};
  std::vector<InputCoverage> seen;
  TargetReport r =
      steps::meet_target_step(qm, config_, source, labelled ? &*labelled : nullptr, holdout,
                              steps::calibration_source(source, holdout), stats, seen, *registry_, progress);
  if (coverage) *coverage = std::move(seen);
  return r;
}

std::optional<RoundingCheck> Session::check_against_rounding(QuantModel& qm, Model float_model,
                                                             const DataSource& calib) const {
  const std::string solver = steps::weight_solver(config_);
  if (!config_.weight_only || !config_.calibration.rounding_check || solver.empty()) return std::nullopt;
  logs::info("checking the solved weights ({}) against round to nearest on the same grid", solver);
  const DataSource source = calib.with_images(config_.data);
  const Config plain = steps::rounding_config(config_);
  QuantModel rounded(prepare(std::move(float_model), source), plain, *registry_, source);
  steps::calibrate(rounded, source, plain, {});
  RoundingCheck r = steps::compare_with_rounding(qm, rounded, config_, source);
  r.solver = solver;
  if (!r.kept_solved) qm = std::move(rounded);
  steps::log_rounding_check(r);
  return r;
}

AgreementCheck Session::check_agreement(QuantModel& qm, const DataSource& calib, std::int64_t holdout) const {
  AgreementCheck r = steps::check_agreement(qm, config_, calib.with_images(config_.data), holdout);
  steps::log_agreement(r);
  return r;
}

namespace {
/// Whether [latency] times exports: on, or auto for ONNX Runtime, and not weight-only (whose
/// exports are for the GPU and large models: bench/llm times them).
bool times_exports(const Config& c) {
  if (c.weight_only || c.latency.enabled == "off") return false;
  return c.latency.enabled == "on" || c.backend == "onnxruntime";
}
}  // namespace

std::optional<LatencySearch> Session::search_latency(QuantModel& qm, const std::string& float_model,
                                                     const DataSource& calib) const {
  if (!times_exports(config_) || !config_.latency.search) return std::nullopt;
  LatencySearch r;
  if (distributed()) r.why_not = "a distributed run";
  else r = steps::search_latency(qm, config_, float_model, calib.with_images(config_.data));
  steps::log_latency_search(r);
  return r;
}

std::string Session::export_onnx(const QuantModel& qm, std::string* external, const std::string& location,
                                 bool all_external) const {
  return qm.serialize(external, location, all_external);
}

std::optional<LatencyReport> Session::time_export(const std::string& float_model, const std::string& bytes,
                                                  const std::string& external, const QuantModel& qm,
                                                  const DataSource& calib) const {
  if (config_.weight_only || config_.latency.enabled == "off") return std::nullopt;
  LatencyReport r =
      steps::time_export(config_, float_model, bytes, external, qm.graph(), calib.with_images(config_.data));
  steps::log_latency(r);
  return r;
}

CalibrationStats Session::init_qat(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress) const {
  const DataSource source = calib.with_images(config_.data);
  steps::allocate_bits(qm, source, progress);
  auto data = source.open(qm.graph().inputs);
  CalibrationStats stats = qm.init_qat(*data, steps::stage(progress, "calibrating"));
  steps::end_step(progress);
  return stats;
}

ProfileReport Session::profile(QuantModel& qm, const DataSource& data, const ProfileOptions& options) const {
  auto samples = data.with_images(config_.data).open(qm.graph().inputs);
  return sparsebit::profile(qm, *samples, options);
}

}  // namespace sparsebit
