#include "sparsebit/core/session.h"

#include "pipeline_steps.h"

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

CalibrationStats Session::calibrate(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress) const {
  const DataSource source = calib.with_images(config_.data);
  steps::allocate_bits(qm, source, progress);
  return steps::calibrate(qm, source, config_, progress);
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
