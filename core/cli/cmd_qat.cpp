// `sparsebit qat`: quantization-aware training by distillation from the float model.

#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

struct QatArgs {
  int nproc = 1;
  std::string model, config, calib, train, output, report, device, checkpoint, loss;
  int epochs = 0;
  double lr = 0;
  bool restart = false;
};

int cmd_qat(const QatArgs& a, const GlobalOptions& g) {
  sb::QatJob job;
  job.config = sb::Config::from_file(a.config);
  sb::Config& config = job.config;
  if (a.epochs > 0) config.qat.epochs = a.epochs;
  if (a.lr > 0) config.qat.lr = a.lr;
  if (!a.loss.empty()) {
    if (a.loss != "mse" && a.loss != "kl") throw sb::Error("--loss must be mse or kl");
    config.qat.loss = a.loss;
  }
  if (!a.device.empty()) config.calibration.device = a.device;
  const std::string checkpoint = a.checkpoint.empty() ? a.output + ".ckpt" : a.checkpoint;
  check_distinct_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}, {"--train", a.train}},
                       {{"-o", a.output, true},
                        {"-o's external data", a.output + ".data"},
                        {"--checkpoint", checkpoint},
                        {"--report", a.report}});
  job.model = a.model;
  job.calib = a.calib;
  job.train = a.train;
  job.output = a.output;
  job.report = a.report;
  job.checkpoint = checkpoint;
  job.restart = a.restart;
  ProgressBars bars{!g.quiet};
  sb::run_qat(job, bars.fn());
  return 0;
}

}  // namespace

Command add_qat(CLI::App& app, const GlobalOptions& g) {
  auto a = std::make_shared<QatArgs>();
  auto* qat =
      app.add_subcommand("qat", "Quantization-aware training by distillation from the float model (no labels needed)");
  qat->add_option("model", a->model, "Float ONNX model")->required();
  qat->add_option("-c,--config", a->config,
                  "TOML config (see configs/w4a4_lsq.toml; [qat] sets the training), or the original toolkit's YAML")
      ->required();
  qat->add_option("--calib", a->calib, "Calibration data for the initial quantizer parameters")->required();
  qat->add_option("--train", a->train, "Training data (unlabeled; same layouts as --calib)")->required();
  qat->add_option("-o,--output", a->output, "Output QDQ ONNX model")->required();
  qat->add_option("--epochs", a->epochs, "Epochs (overrides [qat] epochs)")->check(kPositiveInt);
  qat->add_option("--lr", a->lr, "Adam learning rate (overrides [qat] lr)")->check(kPositiveFinite);
  qat->add_option("--loss", a->loss, "mse or kl (overrides [qat] loss)");
  qat->add_option("--device", a->device, "cpu or cuda[:N] (overrides [calibration] device)")->check(kDevice);
  qat->add_option("--checkpoint", a->checkpoint,
                  "Checkpoint written after every epoch and resumed from (default OUTPUT.ckpt)");
  qat->add_flag("--restart", a->restart, "Ignore an existing checkpoint and start from calibration");
  qat->add_option("--report", a->report, "Write a JSON report (quantizers and per-epoch loss)");
  add_nproc_option(*qat, a->nproc);
  return {qat, [a, &g] {
            if (auto status = launch_workers(a->nproc)) return *status;
            return cmd_qat(*a, g);
          }};
}

}  // namespace sparsebit::cli
