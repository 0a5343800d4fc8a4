// sparsebit.Model's helpers and sparsebit.QuantModel (quant_model.h).

#include "quant_model.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/stl.h>

#include <filesystem>

#include "calls.h"
#include "convert.h"
#include "torch_bridge.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::python {
namespace {

Model copy_model(const Model& m) { return Model{m.graph.clone(), m.meta}; }

std::optional<InputRole> role_of(const std::optional<std::string>& role) {
  if (!role) return std::nullopt;
  if (*role == "activation") return InputRole::kActivation;
  if (*role == "weight") return InputRole::kWeight;
  if (*role == "bias") return InputRole::kBias;
  throw Error("role '" + *role + "' is none of activation, weight, bias");
}

/// forward() runs what the model computes for inputs it can take: the exported model is
/// refused by a runtime for a tensor of another rank or fixed dimension, so the simulation is too.
void check_declared_shape(const at::Tensor& x, const ValueInfo& in) {
  if (!in.has_shape || x.is_nested()) return;
  bool fits = x.dim() == static_cast<std::int64_t>(in.shape.size());
  for (std::size_t i = 0; fits && i < in.shape.size(); ++i)
    fits = in.shape[i].value < 0 || x.size(static_cast<std::int64_t>(i)) == in.shape[i].value;
  if (!fits)
    throw Error("forward(): the input '" + printable(in.name, 80) + "' has shape " + c10::str(x.sizes()) +
                ", the model declares " + shape_text(in.shape) + "; a runtime refuses it too");
}

/// The Session's steps report to `progress(done, total)` while calibrating; the others (bit
/// allocation) only check for Ctrl-C, as before any step.
StepProgressFn calibration_progress(const py::object& progress) {
  const ProgressFn user = progress_of(progress), quiet = progress_of(py::none());
  return [user, quiet](const std::string& step, std::int64_t done, std::int64_t total, const std::string&) {
    if (step.empty()) return;
    (step == "calibrating" ? user : quiet)(done, total);
  };
}

}  // namespace

py::dict value_info_dict(const ValueInfo& v) {
  py::dict d;
  d["name"] = v.name;
  d["type"] = onnx_type_name(v.elem_type);
  if (v.has_shape) {
    py::list dims;
    for (const auto& s : v.shape) {
      if (s.value >= 0) dims.append(s.value);
      else if (!s.param.empty()) dims.append(s.param);
      else dims.append(py::none());
    }
    d["shape"] = dims;
  } else {
    d["shape"] = py::none();
  }
  return d;
}

PyQuantModel::InUse::InUse(std::atomic<bool>& f) : flag(f) {
  if (flag.exchange(true))
    throw Error("this QuantModel is running a call in another thread; use one QuantModel per thread");
}

PyQuantModel::PyQuantModel(py::handle model, py::handle config, py::handle calib) {
  config_ = config_of(config);
  session_ = std::make_shared<Session>(config_);
  calib_ = data_source(calib, "python calib").with_images(config_.data);
  if (py::isinstance<PyModel>(model)) {
    source_ = model.cast<PyModel>();
  } else {
    const std::string path = path_of(model);
    source_ = PyModel{std::make_shared<Model>(without_gil([&] { return session_->load(path, calib_); })), path};
  }
  // Prepared as `sparsebit quantize` would (Note [Session]).
  qm_ = std::make_unique<QuantModel>(without_gil(
      [&] { return session_->quant_model(session_->prepare(copy_model(*source_.model), calib_), calib_); }));
}

py::dict PyQuantModel::calibrate(py::handle data, const py::object& progress) {
  InUse in_use(busy_);
  const DataSource source = data_source(data, "python calibration data").with_images(config_.data);
  if (source.empty()) throw Error("calibrate() needs data: an iterable of arrays, or a data path");
  const StepProgressFn steps = calibration_progress(progress);
  stats_ = without_gil([&] { return session_->calibrate(*qm_, source, steps); });
  // Note [Solved weights against rounding], as `sparsebit quantize` does it.
  rounding_check_.reset();
  if (config_.weight_only)
    rounding_check_ =
        without_gil([&] { return session_->check_against_rounding(*qm_, copy_model(*source_.model), source); });
  calibrated_ = true;
  return stats_dict();
}

py::object PyQuantModel::forward(py::args args, bool quantized) {
  InUse in_use(busy_);
  const auto& inputs = qm_->graph().inputs;
  std::vector<at::Tensor> xs;
  for (auto a : args)  // the user's own tensors where they are of the linked LibTorch
    if (auto t = torch_out_ ? torch_tensor_of(a) : std::nullopt) xs.push_back(*t);
  if (xs.size() != args.size() || xs.size() != inputs.size()) {
    if (args.size() == 1) xs = inputs_of(args[0], inputs, "forward()");
    else xs = inputs_of(py::tuple(args), inputs, "forward()");
  }
  for (std::size_t i = 0; i < xs.size() && i < inputs.size(); ++i) check_declared_shape(xs[i], inputs[i]);
  if (quantized && !calibrated_) throw Error("forward(quantized=True) needs calibrate() first");
  const bool autograd = qat_ && at::GradMode::is_enabled();
  std::vector<at::Tensor> ys = without_gil([&] {
    at::AutoGradMode grad(autograd);  // the caller's thread: torch.no_grad() holds here too
    qm_->set_quant(quantized, quantized);
    return qm_->forward(xs);
  });
  auto out_of = [&](const at::Tensor& y) -> py::object { return torch_out_ ? to_torch(y) : to_numpy(y); };
  if (ys.size() == 1) return out_of(ys[0]);
  py::tuple out(ys.size());
  for (std::size_t i = 0; i < ys.size(); ++i) out[i] = out_of(ys[i]);
  return std::move(out);
}

py::dict PyQuantModel::init_qat(py::handle data, const py::object& progress) {
  InUse in_use(busy_);
  require_linked_torch("init_qat()");
  if (data.is_none()) {
    if (!calibrated_)
      throw Error(
          "init_qat() without data starts from a calibration: call calibrate() first, or pass "
          "init_qat() the calibration data");
    without_gil([&] { qm_->init_qat(); });
    qat_ = torch_out_ = true;
    return stats_dict();
  }
  const DataSource source = data_source(data, "python calibration data").with_images(config_.data);
  if (source.empty()) throw Error("init_qat() needs calibration data: an iterable of arrays, or a data path");
  const StepProgressFn steps = calibration_progress(progress);
  stats_ = without_gil([&] { return session_->init_qat(*qm_, source, steps); });
  calibrated_ = qat_ = torch_out_ = true;
  return stats_dict();
}

py::list PyQuantModel::named_parameters() {
  if (!qat_) throw Error("named_parameters() needs init_qat() first: nothing is trainable before it");
  py::list l;
  for (const auto& [name, t] : qm_->named_parameters()) l.append(py::make_tuple(name, to_torch(t)));
  return l;
}

void PyQuantModel::return_torch(bool on) {
  if (on) require_linked_torch("forward() returning torch tensors");
  torch_out_ = on || qat_;
}

std::size_t PyQuantModel::set_bits(const std::string& glob, int bits, const std::optional<std::string>& role) {
  InUse in_use(busy_);
  const std::size_t n = qm_->set_bits(glob, bits, role_of(role));
  if (n > 0) calibrated_ = false;  // rebuilt observers: calibrate again
  return n;
}

std::size_t PyQuantModel::set_enabled(const std::string& glob, bool enabled, const std::optional<std::string>& role) {
  InUse in_use(busy_);
  return qm_->set_enabled(glob, enabled, role_of(role));
}

py::object PyQuantModel::report() {
  InUse in_use(busy_);
  return json_loads(qm_->report_json(stats_ ? &*stats_ : nullptr));
}

void PyQuantModel::export_onnx(py::handle path, py::handle external_data) {
  InUse in_use(busy_);
  if (!calibrated_) throw Error("export() needs calibrate() first");
  const std::string out = path_of(path);
  namespace fs = std::filesystem;
  std::string location = default_side_file(out);
  bool force = false;
  if (py::isinstance<py::bool_>(external_data)) {
    force = external_data.cast<bool>();
  } else if (!external_data.is_none()) {
    location = path_of(external_data);
    const fs::path l(location);
    if (l.is_absolute() || l.has_parent_path() || location == "." || location == "..")
      throw Error("external_data '" + location +
                  "': give a file name; ONNX keeps external data beside the model, named relative to it");
    force = true;
  }
  const std::string data_path = (fs::path(out).parent_path() / location).string();
  check_distinct_paths(source_files(), {{"path", out, true}, {"external_data", data_path}});
  without_gil([&] {
    std::string external;
    const std::string bytes = qm_->serialize(&external, location, force);
    write_onnx_files(out, bytes, external, location);  // Note [External data side file]
    return 0;
  });
}

py::object PyQuantModel::profile(py::handle data, std::int64_t samples, const std::string& mode, py::handle output) {
  InUse in_use(busy_);
  if (mode != "both" && mode != "accumulated" && mode != "single")
    throw Error("mode must be both, accumulated or single");
  if (!calibrated_) throw Error("profile() needs calibrate() first");
  if (samples < 1) throw Error("samples must be at least 1");
  const DataSource source = data_source(data, "python profiling data").with_images(config_.data);
  if (source.empty()) throw Error("profile() needs data: an iterable of arrays, or a data path");
  const std::string out = output.is_none() ? "" : path_of(output);
  if (!out.empty())
    check_distinct_paths(source_files(), {{"output .json", out + ".json"}, {"output .html", out + ".html"}});
  const std::string json = without_gil([&] {
    std::unique_ptr<AtomicFile> json_file, html_file;
    if (!out.empty()) {
      json_file = std::make_unique<AtomicFile>(out + ".json");
      html_file = std::make_unique<AtomicFile>(out + ".html");
    }
    ProfileOptions opt;
    opt.samples = samples;
    opt.accumulated = mode != "single";
    opt.single = mode != "accumulated";
    opt.progress = progress_of(py::none());
    const ProfileReport r = session_->profile(*qm_, source, opt);
    std::string text = profile_json(r);
    if (json_file) {
      json_file->write(text);
      html_file->write(profile_html(r));
      json_file->commit();
      html_file->commit();
    }
    return text;
  });
  return json_loads(json);
}

py::list PyQuantModel::inputs() const {
  py::list l;
  for (const auto& v : qm_->graph().inputs) l.append(value_info_dict(v));
  return l;
}

py::list PyQuantModel::outputs() const {
  py::list l;
  for (const auto& v : qm_->graph().outputs) l.append(value_info_dict(v));
  return l;
}

py::dict PyQuantModel::stats_dict() const {
  py::dict d;
  d["samples"] = stats_->samples;
  d["batches"] = stats_->batches;
  d["seconds"] = stats_->seconds;
  d["mode"] = stats_->mode;
  if (rounding_check_) {
    const RoundingCheck& r = *rounding_check_;
    d["rounding_check"] =
        py::dict(py::arg("solver") = r.solver, py::arg("loss") = r.loss, py::arg("samples") = r.samples,
                 py::arg("held_out") = r.held_out, py::arg("solved") = r.solved, py::arg("rounded") = r.rounded,
                 py::arg("standard_error") = r.standard_error, py::arg("kept_solved") = r.kept_solved);
  }
  return d;
}

std::vector<PathRole> PyQuantModel::source_files() const {
  std::error_code ec;
  const bool config_file = std::filesystem::is_regular_file(config_.source, ec);
  return {{"the model", source_.path}, {"the config", config_file ? config_.source : ""}};
}

}  // namespace sparsebit::python
