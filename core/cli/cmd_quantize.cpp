// `sparsebit quantize`: calibrate a model and export it as QDQ ONNX, optionally evaluating it.

#include <cstdio>

#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

struct QuantizeArgs {
  int nproc = 1;
  std::string model, config, calib, output, report, device, mode, eval_data, eval_labels, eval_outputs,
      eval_fp32_outputs, target;
  std::vector<std::string> target_outputs;
  bool external_data = false, target_strict = false, latency = false, no_latency = false;
  int batch_size = 0, calib_count = -1;
};

int cmd_quantize(const QuantizeArgs& a, const GlobalOptions& g) {
  sb::QuantizeJob job;
  job.config = sb::Config::from_file(a.config);
  sb::Config& config = job.config;
  if (a.batch_size > 0) config.calibration.batch_size = a.batch_size;
  if (a.calib_count >= 0) config.calibration.count = a.calib_count;
  if (!a.device.empty()) config.calibration.device = a.device;
  if (!a.target.empty()) {
    sb::TargetConfig t = config.target.value_or(sb::TargetConfig{});
    t.parse_expression(a.target, "--target");
    config.target = t;
  }
  if (!a.target_outputs.empty()) {
    if (!config.target) throw sb::Error("--target-outputs needs a target (--target \"maxabs<=0.02\" or [target])");
    config.target->outputs = a.target_outputs;
  }
  if (a.target_strict) {
    if (!config.target) throw sb::Error("--target-strict needs a target (--target \"cosine>=0.99\" or [target])");
    config.target->strict = true;
  }
  if (a.latency && a.no_latency) throw sb::Error("--latency and --no-latency contradict each other; pass one");
  if (a.latency) config.latency.enabled = "on";
  if (a.no_latency) config.latency.enabled = "off";
  if (!a.mode.empty()) {
    if (a.mode != "streaming" && a.mode != "layerwise" && a.mode != "asym")
      throw sb::Error("--mode must be streaming, layerwise or asym");
    config.calibration.mode = a.mode;
  }
  check_distinct_paths({{"the model", a.model},
                        {"-c", a.config},
                        {"--calib", a.calib},
                        {"--eval-data", a.eval_data},
                        {"--eval-labels", a.eval_labels}},
                       {{"-o", a.output, true},
                        {"-o's external data", a.output + ".data"},
                        {"--report", a.report},
                        {"--eval-outputs", a.eval_outputs},
                        {"--eval-fp32-outputs", a.eval_fp32_outputs}});
  job.model = a.model;
  job.calib = a.calib;
  job.output = a.output;
  job.report = a.report;
  job.external_data = a.external_data;
  if (!a.eval_data.empty())
    job.evaluation = sb::EvaluationRequest{a.eval_data, a.eval_labels, a.eval_outputs, a.eval_fp32_outputs};
  ProgressBars bars{!g.quiet};
  const sb::QuantizeOutcome r = sb::run_quantize(job, bars.fn());
  if (r.evaluation) {
    const sb::EvaluationResult& ev = *r.evaluation;
    std::printf("\n%-28s %10s\n", "evaluation", "value");
    std::printf("%-28s %10lld\n", "samples", static_cast<long long>(ev.samples));
    if (ev.fp32_accuracy) {
      std::printf("%-28s %9.2f%%\n", "FP32 accuracy", 100 * *ev.fp32_accuracy);
      std::printf("%-28s %9.2f%%\n", "simulated quantized accuracy", 100 * *ev.simulated_accuracy);
    }
    std::printf("%-28s %9.2f%%\n", "top-1 agreement", 100 * ev.top1_agreement);
  }
  if (r.target) {
    const sb::TargetReport& t = *r.target;
    std::printf("\n%-28s %s (%s)\n", "target", t.target.c_str(), t.reached ? "reached" : "NOT reached");
    std::printf("%-28s %.6g\n", "every layer quantized", t.before);
    std::printf("%-28s %.6g\n", "as exported", t.after);
    std::string remedies;
    for (const auto& [name, n] : t.remedies) remedies += ", " + name + " " + std::to_string(n);
    std::printf("%-28s %zu of %zu (int16/float budget %zu)%s\n", "layers remedied", t.fallback_layers.size(),
                t.quantized_layers, t.budget, remedies.c_str());
    std::printf("%-28s %d\n", "evaluations", t.evaluations);
  }
  return 0;
}

}  // namespace

Command add_quantize(CLI::App& app, const GlobalOptions& g) {
  auto a = std::make_shared<QuantizeArgs>();
  auto* quantize = app.add_subcommand("quantize", "Calibrate a model and export it as QDQ ONNX");
  quantize->add_option("model", a->model, "Float ONNX model")->required();
  quantize->add_option("-c,--config", a->config, "TOML config (see configs/), or the original toolkit's YAML (.yaml)")
      ->required();
  quantize->add_option("--calib", a->calib, "Calibration data: .npy folder, ONNX test-data folder, or IDX file")
      ->required();
  quantize->add_option("-o,--output", a->output, "Output QDQ ONNX model")->required();
  quantize->add_option("--report", a->report, "Write a JSON report of every quantized tensor");
  quantize->add_option("--batch-size", a->batch_size, "Calibration batch size (overrides [calibration] batch_size)")
      ->check(kPositiveInt);
  quantize
      ->add_option("--calib-count", a->calib_count,
                   "Calibration samples to use, 0 = all (overrides [calibration] count)")
      ->check(kNonNegativeInt);
  quantize->add_option("--device", a->device, "cpu or cuda[:N] (overrides [calibration] device)")->check(kDevice);
  quantize->add_option(
      "--mode", a->mode,
      "calibration: streaming (default), layerwise, or asym (layerwise on the quantized model's own activations)");
  auto* eval_data =
      quantize->add_option("--eval-data", a->eval_data, "Also evaluate FP32 vs simulated quantized on this data");
  // Without the data they describe these would be ignored: refused instead.
  quantize->add_option("--eval-labels", a->eval_labels, "IDX labels for --eval-data (prints accuracies)")
      ->needs(eval_data);
  quantize
      ->add_option("--eval-outputs", a->eval_outputs,
                   "Write the simulated quantized first output on --eval-data as .npy")
      ->needs(eval_data);
  quantize
      ->add_option("--eval-fp32-outputs", a->eval_fp32_outputs, "Write the FP32 first output on --eval-data as .npy")
      ->needs(eval_data);
  quantize->add_option(
      "--target", a->target,
      "Accuracy to keep, e.g. \"cosine>=0.99\", \"sqnr>=30\", \"mse<=1e-4\", \"maxabs<=0.02\", "
      "\"argmax-agreement>=0.99\" (the class chosen along each output's last axis), \"ctc-agreement>=0.99\" "
      "(a CTC recognizer's greedy decoding, [target] ctc_blank), "
      "\"top1-drop<=0.5\" (with "
      "--eval-data/--eval-labels): the most sensitive layers fall back to int16/float until it holds");
  quantize
      ->add_option("--target-outputs", a->target_outputs,
                   "Graph outputs the target is measured on, comma-separated (default: every floating-point "
                   "output), e.g. a probability and not a recurrent state returned beside it")
      ->delimiter(',');
  quantize->add_flag("--target-strict", a->target_strict,
                     "A target not reached is an error (exit 1, nothing written) instead of a warning");
  quantize->add_flag("--external-data", a->external_data,
                     "Write initializers of 1 KiB or more to OUTPUT.data (ONNX external data); automatic above 1 GiB");
  quantize->add_flag("--latency", a->latency,
                     "Time the export against the float model in ONNX Runtime (1 thread and every core; [latency]) "
                     "and fail if it cannot; by default it is timed where ONNX Runtime is found");
  quantize->add_flag("--no-latency", a->no_latency, "Do not time the export in ONNX Runtime");
  add_nproc_option(*quantize, a->nproc);
  return {quantize, [a, &g] {
            if (auto status = launch_workers(a->nproc)) return *status;
            return cmd_quantize(*a, g);
          }};
}

}  // namespace sparsebit::cli
