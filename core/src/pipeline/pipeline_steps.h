#pragma once
// The steps a job is made of, shared by the jobs of pipeline.cpp (Note [Pipeline order]):
// calibration with its logging, the agreement check, input coverage, the accuracy target's
// hold-out and search. Internal to the core.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"

namespace sparsebit::steps {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Adapts a StepProgressFn to the (done, total) callbacks of calibration and evaluation.
inline ProgressFn stage(const StepProgressFn& progress, const std::string& name) {
  if (!progress) return {};
  return [progress, name](std::int64_t done, std::int64_t total) { progress(name, done, total, ""); };
}

/// Ends a step's progress line.
inline void end_step(const StepProgressFn& progress) {
  if (progress) progress("", 0, 0, "");
}

/// 1.23 G, 4.56 M, 7.8 k: counts in tables.
std::string human(double v);

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

/// Logs which sizes the calibration data gave each open input dimension.
void log_coverage(const std::vector<InputCoverage>& coverage);

AgreementCheck check_agreement(QuantModel& qm, const Config& config, const DataSource& calib,
                               std::int64_t target_holdout);
void log_agreement(const AgreementCheck& a);

/// Note [Solved weights against rounding]: what solved a weight-only config's weights beyond
/// plain rounding ("" where nothing did), and the config of round to nearest on the same grid.
std::string weight_solver(const Config& config);
Config rounding_config(const Config& config);
/// `solved` and `rounded` (both calibrated) scored by the model's loss on `calib`'s first samples.
RoundingCheck compare_with_rounding(QuantModel& solved, QuantModel& rounded, const Config& config,
                                    const DataSource& calib);
void log_rounding_check(const RoundingCheck& r);

/// Note [Latency step]: `bytes` (the serialized export, `external` its external data if any)
/// timed against the float model at `float_model`; measure_latency on a temporary copy.
LatencyReport time_export(const Config& config, const std::string& float_model, const std::string& bytes,
                          const std::string& external, const Graph& graph, const DataSource& calib);
void log_latency(const LatencyReport& r);

/// Note [Latency search]: the regions of quantized main-graph nodes (flat numbers, graph order).
std::vector<std::vector<std::size_t>> quantized_regions(const QuantModel& qm);
/// Times regions of the calibrated `qm` as float and switches off those that run faster so.
LatencySearch search_latency(QuantModel& qm, const Config& config, const std::string& float_model,
                             const DataSource& calib);
void log_latency_search(const LatencySearch& r);

/// Warns loudly when the backend and skip globs leave nothing quantized, saying why.
void warn_if_nothing_quantized(QuantModel& qm, const Config& config);

/// Calibrates the QuantModel on `data` (or the data at `calib`), logging what it does.
/// With [bit_allocation]: chooses and sets per-input widths (Note [Bit allocation]), logging
/// them; calibrate next. Nothing without the table.
void allocate_bits(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress);
CalibrationStats calibrate(QuantModel& qm, Dataset& data, const Config& config, const StepProgressFn& progress);
CalibrationStats calibrate(QuantModel& qm, const DataSource& calib, const Config& config,
                           const StepProgressFn& progress);

/// Refuses a [target] that cannot run: no value, beside [bit_allocation], or top1-drop without
/// labelled data in `eval`.
void check_target(const Config& config, const EvaluationRequest* eval);

/// How many calibration samples the accuracy target keeps apart (Note [Accuracy target]).
std::int64_t holdout_count(const TargetConfig& t, const DataSource& calib, const std::vector<ValueInfo>& inputs);

/// The calibration samples: all of them, or all but the first `holdout`.
DataSource calibration_source(const DataSource& calib, std::int64_t holdout);

/// Calibrates on `calibration` (`calib` less its first `holdout` samples), then meets
/// config.target on those samples (16 calibration samples without a holdout); `eval` gives
/// top1-drop its labelled data.
TargetReport meet_target_step(QuantModel& qm, const Config& config, const DataSource& calib,
                              const EvaluationRequest* eval, std::int64_t holdout, const DataSource& calibration,
                              CalibrationStats& stats, std::vector<InputCoverage>& coverage, const Registry& registry,
                              const StepProgressFn& progress);

}  // namespace sparsebit::steps
