#include "jobs.h"

#include <pybind11/stl.h>

#include "calls.h"
#include "convert.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::python {

py::object quantize(py::handle model, py::handle config, py::handle calib, py::handle output, py::handle report,
                    const std::optional<std::string>& target, bool target_strict, bool external_data,
                    py::handle eval_data, const py::object& progress) {
  QuantizeJob job;
  job.config = config_of(config);
  if (target) {
    TargetConfig t = job.config.target.value_or(TargetConfig{});
    t.parse_expression(*target, "target");
    job.config.target = t;
  }
  if (target_strict) {
    if (!job.config.target) throw Error("target_strict needs a target (target=\"cosine>=0.99\" or [target])");
    job.config.target->strict = true;
  }
  job.model = path_of(model);
  job.calib = data_source(calib, "python calib");
  if (job.calib.empty()) throw Error("quantize() needs calib: an iterable of arrays, or a data path");
  job.output = path_of(output);
  job.report = report.is_none() ? "" : path_of(report);
  job.external_data = external_data;
  if (DataSource eval = data_source(eval_data, "python eval data"); !eval.empty())
    job.evaluation = EvaluationRequest{eval, "", "", ""};
  const std::string json = without_gil([&] { return report_json(run_quantize(job, step_progress_of(progress))); });
  return json_loads(json);
}

py::object qat(py::handle model, py::handle config, py::handle calib, py::handle train, py::handle output,
               std::optional<int> epochs, std::optional<double> lr, py::handle checkpoint, bool resume,
               py::handle report, const py::object& progress) {
  QatJob job;
  job.config = config_of(config);
  if (epochs) {
    if (*epochs < 1) throw Error("epochs must be at least 1");
    job.config.qat.epochs = *epochs;
  }
  if (lr) {
    if (!(*lr > 0)) throw Error("lr must be positive");
    job.config.qat.lr = *lr;
  }
  job.model = path_of(model);
  job.calib = data_source(calib, "python calib");
  job.train = data_source(train, "python train");
  if (job.calib.empty() || job.train.empty()) throw Error("qat() needs calib and train data");
  job.output = path_of(output);
  job.report = report.is_none() ? "" : path_of(report);
  job.checkpoint = checkpoint.is_none() ? "" : path_of(checkpoint);
  job.restart = !resume;
  const std::string json = without_gil([&] {
    const QatOutcome r = run_qat(job, step_progress_of(progress));
    return report_json(r, job);
  });
  return json_loads(json);
}

py::object prune(py::handle model, py::handle config, py::handle output, py::handle calib, py::handle train,
                 int finetune_epochs, py::handle report, py::handle masked, const py::object& progress) {
  PruneJob job;
  job.config = config_of(config);
  job.model = path_of(model);
  job.calib = data_source(calib, "python calib");
  job.train = data_source(train, "python train");
  if (finetune_epochs < 0) throw Error("finetune_epochs must be 0 or more");
  job.finetune_epochs = finetune_epochs;
  job.output = path_of(output);
  job.report = report.is_none() ? "" : path_of(report);
  job.masked = masked.is_none() ? "" : path_of(masked);
  const std::string json = without_gil([&] {
    const PruneOutcome r = run_prune(job, step_progress_of(progress));
    return report_json(r, job);
  });
  return json_loads(json);
}

py::list plugins(py::handle config) {
  const Session session(config.is_none() ? Config() : config_of(config));
  const Registry& registry = session.registry();
  py::list out;
  for (const auto& p : registry.plugins()) {
    py::dict d;
    d["name"] = p.name;
    d["file"] = p.file;
    d["status"] = p.status_name();
    d["version"] = p.version;
    d["sdk_version"] = p.sdk_version;
    d["registered"] = p.registered;
    if (!p.reason.empty()) d["reason"] = p.reason;
    out.append(d);
  }
  return out;
}

}  // namespace sparsebit::python
