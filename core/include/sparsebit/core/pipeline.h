#pragma once
/// \file
/// The whole jobs, each run on a Session (sparsebit/core/session.h, which hosts include): the
/// CLI's quantize, qat and prune commands are one call each, as an application's may be.
///
/// Note [Pipeline order]
///   claim the output files -> load the plugins -> load and lift the model (opset 13) ->
///   [prune] -> [BatchNorm re-estimation] -> build the QuantModel (passes, placement) ->
///   calibrate (or QAT: calibrate, then distil) -> [accuracy target: fallback layers] ->
///   [evaluate] -> export -> write the files.
/// Outputs are claimed first, so an unwritable path fails before any work, and committed last:
/// the external-data side file, then the report, then the model, so a model never refers to a
/// side file that is not there. A failed step leaves no file behind.
///
///     sparsebit::QuantizeJob job;
///     job.model = "model.onnx";
///     job.calib = "calib/";
///     job.config = sparsebit::Config::from_file("w8a8.toml");
///     job.output = "model_int8.onnx";
///     sparsebit::QuantizeOutcome r = sparsebit::run_quantize(job);
///     std::string report = sparsebit::report_json(r);
///
/// Samples held in memory come as an opener instead of a path (Note [Data sources]):
///
///     job.calib = sparsebit::DataSource("camera frames", [&](const auto& inputs) {
///       return std::make_unique<FrameDataset>(frames, inputs);  // a sparsebit::Dataset
///     });

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// Progress of a long step: its name ("calibrating", "evaluating", "epoch 2/5", "fine-tuning
/// 1/3"), samples done, the total (-1 when unknown) and a short note (" loss 0.0123"). An empty
/// name ends the step (the CLI closes its progress line before the next message).
using StepProgressFn =
    std::function<void(const std::string& step, std::int64_t done, std::int64_t total, const std::string& note)>;

/// Float vs simulated-quantized agreement on evaluation data (with labels: both accuracies).
struct EvaluationRequest {
  DataSource data;           ///< samples, in any calibration-data format
  std::string labels;        ///< IDX labels, one per sample ("": none)
  std::string outputs;       ///< .npy of the simulated outputs ("": not written)
  std::string fp32_outputs;  ///< .npy of the float outputs ("": not written)
};

struct EvaluationResult {
  std::int64_t samples = 0;
  double top1_agreement = 0;
  double max_abs_output_diff = 0;
  std::optional<double> fp32_accuracy;
  std::optional<double> simulated_accuracy;
};

/// Note [Agreement check]: how the quantized model's outputs agree with float's on a few samples,
/// printed (and warned about when poor) by every quantize.
struct AgreementCheck {
  std::int64_t samples = 0;
  bool held_out = false;  ///< the samples were not used for calibration
  struct Output {
    std::string name;
    double cosine = 1, sqnr_db = 0;  ///< over the elements finite in both models; NaN where none is
    std::int64_t elements = 0;
    std::int64_t not_finite_float = 0;      ///< NaN or infinite in the float model
    std::int64_t not_finite_quantized = 0;  ///< NaN or infinite quantized only: a disagreement
  };
  std::vector<Output> outputs;
  bool poor = false;  ///< some output's cosine is below kPoorCosine, unmeasurable, or not finite quantized
  static constexpr double kPoorCosine = 0.99;
};

/// Note [Solved weights against rounding] (core/src/pipeline/rounding_check.cpp): a weight-only
/// run whose weights were solved (a pass the config turned on, such as AWQ; GPTQ; a clip search)
/// judged against round to nearest on the same grid by the model's loss on the calibration data.
struct RoundingCheck {
  std::string solver;  ///< what solved the weights, e.g. "awq, gptq"
  std::string loss;    ///< "next-token loss" (nats per token) or "output error" (relative to float)
  std::int64_t samples = 0;
  bool held_out = false;  ///< the samples came after [calibration] count: the weights were not solved on them
  double solved = 0, rounded = 0;
  double standard_error = 0;  ///< of the per-sample difference solved - rounded (0 with one sample)
  bool kept_solved = true;  ///< false: rounded was lower by more than two standard errors  ///< false: the export holds
                            ///< the rounded weights
};

/// The sizes the calibration data gave each model input with dimensions the model leaves open
/// (symbolic or unknown), smallest and largest per dimension; the batch dimension is left out.
struct InputCoverage {
  std::string input;
  std::vector<std::int64_t> min, max;  ///< per sample dimension (the model input's dims 1..)
  std::vector<bool> open;              ///< whether the model leaves that dimension open
};

/// The latency step's result (Note [Latency step] in core/src/pipeline/latency.cpp).
struct LatencyReport {
  bool measured = false;
  std::string why_not;  ///< when not measured: what was missing
  std::string runtime;  ///< the onnxruntime-node folder that timed it
  struct Row {
    std::int64_t threads = 0;
    double float_ms = 0, export_ms = 0;
  };
  std::vector<Row> rows;
  std::int64_t float_bytes = 0, export_bytes = 0;  ///< the files' sizes
};

/// The latency search's result (Note [Latency search] in core/src/pipeline/latency_search.cpp).
struct LatencySearch {
  bool ran = false;
  std::string why_not;                ///< when it did not run: why
  std::size_t regions = 0;            ///< quantized regions of the main graph
  std::vector<std::int64_t> threads;  ///< the thread counts timed
  std::int64_t runs = 0;
  struct Region {
    std::vector<std::string> nodes;  ///< in graph order
    bool made_float = false;
    /// Per thread count: the export's time over the export's with this region float (above 1:
    /// float is faster), and the rounds in which the region float ran faster.
    std::vector<double> speedup_as_float;
    std::vector<std::int64_t> rounds_faster_as_float;
  };
  std::vector<Region> timed;  ///< the regions timed, in the order they were chosen
  /// Per thread count: the export's time over its time with every region that ran faster as
  /// float made float (empty when none did); `reverted` when that was not faster after all.
  std::vector<double> speedup_together;
  bool reverted = false;
  double seconds = 0;
};

/// Times `export_model` (the written export) against `float_model` in ONNX Runtime on the first
/// sample of `calib` as `config` says; a run that cannot time them says why in the result.
SPARSEBIT_API LatencyReport measure_latency(const LatencyConfig& config, const std::string& float_model,
                                            const std::string& export_model, const Graph& graph,
                                            const DataSource& calib);

struct QuantizeJob {
  std::string model;  ///< float ONNX model
  DataSource calib;   ///< calibration data (Note [Data sources])
  Config config;
  std::string output;          ///< the QDQ model; large initializers go to output + ".data" when needed
  std::string report;          ///< JSON report ("": not written)
  bool external_data = false;  ///< every initializer in output + ".data"
  std::optional<EvaluationRequest> evaluation;
};

struct QuantizeOutcome {
  double import_ms = 0;
  /// Wall seconds of each step that ran, in order: load, prune, bn_tuning, passes, calibration,
  /// parameters, target, evaluation, export, latency (where timed), write (`-v` prints them; the
  /// report has them).
  std::vector<std::pair<std::string, double>> phase_seconds;
  CalibrationStats calibration;
  std::size_t quantized_inputs = 0;
  std::optional<PruneSummary> pruning;  ///< when [sparse] pruned first
  QuantizationReport quantization;      ///< every quantized input and its parameters
  std::optional<EvaluationResult> evaluation;
  std::optional<TargetReport> target;  ///< when [target] or --target asked for one
  std::optional<AgreementCheck> agreement;
  std::optional<RoundingCheck> rounding_check;  ///< weight-only runs whose weights were solved
  std::vector<InputCoverage> input_coverage;    ///< inputs with open dimensions
  bool external_data_written = false;
  std::optional<LatencyReport> latency;         ///< unless [latency] enabled = false
  std::optional<LatencySearch> latency_search;  ///< where [latency] search asked for one
  /// What a user should know before deploying the export (how a runtime must load it), also
  /// printed; the report's "notes".
  std::vector<std::string> notes;
};

struct QatJob {
  std::string model;
  DataSource calib, train;
  Config config;  ///< [qat] holds epochs, lr, loss...
  std::string output;
  std::string report;      ///< "": not written
  std::string checkpoint;  ///< "": output + ".ckpt"
  bool restart = false;    ///< discard the checkpoint and start over
};

struct QatOutcome {
  CalibrationStats calibration;
  QatResult training;
  std::string checkpoint;
  QuantizationReport quantization;
};

struct PruneJob {
  std::string model;
  DataSource calib;  ///< bias compensation, and calibration when the config also quantizes
  DataSource train;  ///< fine-tuning data (needed when finetune_epochs > 0)
  Config config;     ///< needs [sparse]; [w]/[a] quantize the pruned model too
  int finetune_epochs = 0;
  std::string output;
  std::string report;  ///< "": not written
  std::string masked;  ///< the unpruned model with the pruned weights zeroed ("": not written)
};

struct PruneOutcome {
  PruneSummary pruning;
  bool quantized = false;
  std::optional<CalibrationStats> calibration;
  std::optional<QuantizationReport> quantization;  ///< when the config also quantizes
  std::vector<double> finetune_losses;             ///< mean loss per fine-tuning epoch
  bool finetune_quantization_aware = false;
};

/// Loads and lifts a float model for quantization: refuses models that already hold Q/DQ nodes.
SPARSEBIT_API Model load_float_model(const std::string& path, const Registry& registry, const DataSource& calib);

/// Prunes as [sparse] says, logging the before/after table.
SPARSEBIT_API PruneResult prune_step(const Model& model, const Config& config, const Registry& registry,
                                     const DataSource& calib);

/// Note [One preparation for every host]
/// Every host that quantizes a model (run_quantize, run_qat, `sparsebit profile`, Python's
/// QuantModel) takes its float model from prepare_model (Session::prepare), so a config means
/// the same in each:
/// [sparse] prunes, then [schedule] bn_tuning re-estimates BatchNormalization statistics, both
/// before any quantizer is placed. A host that built its QuantModel from the loaded model would
/// quantize another network than `sparsebit quantize` does with the same config.
struct Preparation {
  std::optional<PruneSummary> pruning;                        ///< when [sparse] pruned
  std::vector<std::pair<std::string, double>> phase_seconds;  ///< "prune", "bn_tuning": those that ran
};

/// The loaded float model as the config prepares it for quantization (see the note above).
/// `calib` feeds pruning's bias compensation and BN re-estimation, which refuses to run without it.
SPARSEBIT_API Model prepare_model(Model model, const Config& config, const Registry& registry, const DataSource& calib,
                                  Preparation* done = nullptr);

/// Runs a float and the simulated quantized model over evaluation data.
SPARSEBIT_API EvaluationResult evaluate(QuantModel& qm, const EvaluationRequest& request,
                                        const StepProgressFn& progress = {});

SPARSEBIT_API QuantizeOutcome run_quantize(const QuantizeJob& job, const StepProgressFn& progress = {});
SPARSEBIT_API QatOutcome run_qat(const QatJob& job, const StepProgressFn& progress = {});
SPARSEBIT_API PruneOutcome run_prune(const PruneJob& job, const StepProgressFn& progress = {});

/// The JSON reports the jobs write, made from the typed outcomes.
SPARSEBIT_API std::string report_json(const QuantizeOutcome& outcome);
SPARSEBIT_API std::string report_json(const QatOutcome& outcome, const QatJob& job);
SPARSEBIT_API std::string report_json(const PruneOutcome& outcome, const PruneJob& job);

}  // namespace sparsebit
