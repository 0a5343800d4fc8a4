// `sparsebit prune`: prune a model, then fine-tune and quantize it if the config says so.

#include "sparsebit/core/session.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

struct PruneArgs {
  int nproc = 1;
  std::string model, config, calib, output, report, masked, train, device;
  int finetune = 0;
};

int cmd_prune(const PruneArgs& a, const GlobalOptions& g) {
  sb::PruneJob job;
  job.config = sb::Config::from_file(a.config);
  if (!a.device.empty()) job.config.calibration.device = a.device;
  check_distinct_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}, {"--train", a.train}},
                       {{"-o", a.output, true},
                        {"-o's external data", a.output + ".data"},
                        {"--report", a.report},
                        {"--masked", a.masked}});
  job.model = a.model;
  job.calib = a.calib;
  job.train = a.train;
  job.finetune_epochs = a.finetune;
  job.output = a.output;
  job.report = a.report;
  job.masked = a.masked;
  ProgressBars bars{!g.quiet};
  sb::run_prune(job, bars.fn());
  return 0;
}

}  // namespace

Command add_prune(CLI::App& app, const GlobalOptions& g) {
  auto a = std::make_shared<PruneArgs>();
  auto* prune =
      app.add_subcommand("prune", "Prune a model ([sparse] in the config); with [w]/[a] too, then quantize it");
  prune->add_option("model", a->model, "Float ONNX model")->required();
  prune->add_option("-c,--config", a->config, "TOML config with a [sparse] table (see configs/prune_*.toml)")
      ->required();
  prune->add_option("--calib", a->calib,
                    "Data: its first sample fixes the shapes; required when the config also quantizes");
  prune->add_option("-o,--output", a->output, "Output ONNX model")->required();
  prune->add_option("--report", a->report,
                    "Write a JSON report: parameters, file size, FLOPs before/after, every layer");
  prune->add_option("--masked", a->masked, "Also write the masked model (original shapes, pruned weights zero)");
  prune->add_option("--finetune", a->finetune, "Fine-tune this many epochs by distillation from the unpruned model")
      ->check(kPositiveInt);
  prune->add_option("--train", a->train, "Training data for --finetune (unlabeled; same layouts as --calib)");
  prune->add_option("--device", a->device, "cpu or cuda[:N] for fine-tuning (overrides [calibration] device)")
      ->check(kDevice);
  add_nproc_option(*prune, a->nproc);
  return {prune, [a, &g] {
            if (auto status = launch_workers(a->nproc)) return *status;
            return cmd_prune(*a, g);
          }};
}

}  // namespace sparsebit::cli
