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
///   (passes, placement) -> calibrate (bit allocation, then ranges) -> target / latency / export, in that order (Note
///   [Pipeline order]); `simplify` is the float-only path. Two Sessions with different plugin sets live side by side in
///   one process. The QuantModels a Session makes refer to its registry: the Session outlives them.
///
///     sparsebit::Session session(sparsebit::Config::from_file("w8a8.toml"));
///     sparsebit::DataSource calib("calib/");
///     sparsebit::QuantModel qm =
///         session.quant_model(session.prepare(session.load("model.onnx", calib), calib), calib);
///     session.calibrate(qm, calib);
///     qm.export_onnx("model_int8.onnx");

#include <memory>
#include <string>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/profiler.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"

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
  /// [bit_allocation]'s widths where the config has the table, then the ranges, logged.
  CalibrationStats calibrate(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress = {}) const;
  /// Quantization-aware training's start: calibrate as above, then weights and quantizer
  /// parameters become trainable (QuantModel::init_qat).
  CalibrationStats init_qat(QuantModel& qm, const DataSource& calib, const StepProgressFn& progress = {}) const;
  /// Per-layer error of a calibrated model on the first samples of `data`.
  ProfileReport profile(QuantModel& qm, const DataSource& data, const ProfileOptions& options = {}) const;

 private:
  Config config_;
  std::unique_ptr<Registry> registry_;  // QuantModels keep a reference: its address never moves
};

}  // namespace sparsebit
