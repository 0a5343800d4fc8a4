#pragma once
/// \file
/// The session: one config, the plugins it names, and the steps of every job as methods. A host
/// (the CLI's commands, Python's QuantModel, an application) includes this header and drives a
/// Session; the jobs of pipeline.h run on one too.
///
/// Note [Session]
///   The one header a host includes for the library (tools/check-core-layers.py holds the hosts
///   to it and to a few utilities: atomic files, the distributed launch, graph drawings). A Session loads the plugins
///   its config names into a registry of its own and applies the config to each step, so two hosts given the same
///   config quantize the same network: the steps are load -> prepare (prune, BatchNorm re-estimation) -> quant_model
///   (passes, placement) -> calibrate (bit allocation, then ranges; or meet_target) -> check_against_rounding
///   (weight-only) -> check_agreement -> search_latency -> export_onnx -> time_export, in that order (Note [Pipeline
///   order]); `simplify` is the float-only path. Two Sessions with different plugin sets live side by side in one
///   process. The QuantModels a Session makes refer to its registry: the Session outlives them.
///
///     sparsebit::Session session(sparsebit::Config::from_file("w8a8.toml"));
///     sparsebit::DataSource calib("calib/");
///     sparsebit::QuantModel qm =
///         session.quant_model(session.prepare(session.load("model.onnx", calib), calib), calib);
///     session.calibrate(qm, calib);
///     qm.export_onnx("model_int8.onnx");

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/profiler.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/core/target.h"

namespace sparsebit {

class SPARSEBIT_API Session {
 public:
  /// Loads the plugins `config` names ([plugins]).
  explicit Session(Config config);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session();

  const Config& config() const { return config_; }
  const Registry& registry() const { return *registry_; }
  /// The passes a run follows, in order, each switched on or off (Note [Pass schedule]).
  std::vector<ScheduleEntry> schedule() const;

  // -- the steps, in order -------------------------------------------------------------------
  /// A float model, lifted to opset 13 for quantization; refuses one that holds Q/DQ nodes.
  /// `calib` gives the sizes of dimensions the model leaves open.
  Model load(const std::string& path, const DataSource& calib = {}) const;
  /// A model to look at or simplify, Q/DQ nodes kept: as it is, or lifted to opset `lift_to`.
  Model read(const std::string& path, int lift_to = 0) const;
  /// [sparse] pruning, then [schedule] bn_tuning (Note [One preparation for every host]).
  Model prepare(Model model, const DataSource& calib, Preparation* done = nullptr) const;
  /// The simplify-stage passes of the schedule, on a float model.
  void simplify(Model& model) const;
  /// The quantizable model: the other passes, then quantizers placed as the backend wants.
  QuantModel quant_model(Model model, const DataSource& calib = {}) const;
  /// [bit_allocation]'s widths where the config has the table, then the ranges, logged; into
  /// `coverage`, where given, the sizes the data gave each input dimension the model leaves open.
  CalibrationStats calibrate(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress = {},
                             std::vector<InputCoverage>* coverage = nullptr) const;
  /// Quantization-aware training's start: calibrate as above, then weights and quantizer
  /// parameters become trainable (QuantModel::init_qat).
  CalibrationStats init_qat(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress = {}) const;
  /// Note [Solved weights against rounding]: where the run is weight-only and its weights were
  /// solved, the calibrated `qm` against round to nearest on the same grid from `float_model` (as
  /// load() gave it), each scored by the model's loss on `calib`; the rounded model takes the
  /// place of `qm` where it scores better, logged with both losses. std::nullopt where nothing
  /// was solved or [calibration] rounding_check is off.
  std::optional<RoundingCheck> check_against_rounding(QuantModel& qm, Model float_model, const DataSource& calib) const;
  /// With [target] (Note [Accuracy target]): how many of `calib`'s first samples are kept apart
  /// to measure it on (0 without [target]); the passes and calibration then see
  /// calibration_samples(calib, holdout), the rest.
  std::int64_t target_holdout(const DataSource& calib, const Model& model) const;
  DataSource calibration_samples(const DataSource& calib, std::int64_t holdout) const;
  /// In place of calibrate() with [target]: calibrates on calibration_samples(calib, holdout), then
  /// remedies layers until the target holds or its budget is spent (throws when a strict target
  /// is missed). `eval` is the labelled data a top1-drop target needs.
  TargetReport meet_target(QuantModel& qm, const DataSource& calib, std::int64_t holdout, CalibrationStats& stats,
                           std::vector<InputCoverage>* coverage = nullptr, const EvaluationRequest* eval = nullptr,
                           const StepProgressFn& progress = {}) const;
  /// Note [Agreement check]: the calibrated model's outputs against float's on a few samples (the
  /// held-out ones where there are), logged, with a warning when poor.
  AgreementCheck check_agreement(QuantModel& qm, const DataSource& calib, std::int64_t holdout = 0) const;
  /// Note [Latency search]: where [latency] asks for it, regions of the calibrated model that run
  /// faster in float (timed in ONNX Runtime against the float model at `float_model`) are made
  /// float, logged; std::nullopt where [latency] does not ask for it.
  std::optional<LatencySearch> search_latency(QuantModel& qm, const std::string& float_model,
                                              const DataSource& calib) const;
  /// The QDQ export's bytes, as the backend wants it; initializers that go to the side file
  /// `location` (named relative to the model: every one of 1 KiB or more with `all_external`,
  /// else only as protobuf's 2 GiB limit needs) are left in `external`.
  std::string export_onnx(const QuantModel& qm, std::string* external, const std::string& location,
                          bool all_external = false) const;
  /// Note [Latency step]: the export (`bytes`, `external`) timed against the float model in ONNX
  /// Runtime, logged; std::nullopt where [latency] is off (or the run is weight-only).
  std::optional<LatencyReport> time_export(const std::string& float_model, const std::string& bytes,
                                           const std::string& external, const QuantModel& qm,
                                           const DataSource& calib) const;
  /// Per-layer error of a calibrated model on the first samples of `data`.
  ProfileReport profile(QuantModel& qm, const DataSource& data, const ProfileOptions& options = {}) const;

 private:
  Config config_;
  std::unique_ptr<Registry> registry_;  // QuantModels keep a reference: its address never moves
};

}  // namespace sparsebit
