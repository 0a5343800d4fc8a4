// The `sparsebit` Python package's extension module: the pipeline API (core/include) bound with
// pybind11. The package's __init__.py re-exports it; docs/PYTHON.md is the user's guide.
//
// Note [Python calls]
// Every call that runs the pipeline releases the GIL, so other Python threads keep running. Data
// and progress callbacks reach back into Python by taking the GIL again; before each sample they
// check for signals, so Ctrl-C (KeyboardInterrupt) or an exception raised by the user's data
// unwinds the C++ run like any error: outputs are written through AtomicFile, so nothing is left
// behind. Such a Python exception is parked (PythonErrors) while C++ unwinds and raised again as
// itself once the GIL is back; every C++ error becomes sparsebit.Error with the message the
// `sparsebit` command prints.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "calls.h"
#include "convert.h"
#include "jobs.h"
#include "torch_bridge.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/version.h"

namespace py = pybind11;
namespace sb = sparsebit;

namespace {

using namespace sparsebit::python;
struct PyModel {
  std::shared_ptr<const sb::Model> model;
  std::string path;
};

sb::Model copy_model(const sb::Model& m) { return sb::Model{m.graph.clone(), m.meta}; }

py::dict value_info_dict(const sb::ValueInfo& v) {
  py::dict d;
  d["name"] = v.name;
  d["type"] = sb::onnx_type_name(v.elem_type);
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

std::optional<sb::InputRole> role_of(const std::optional<std::string>& role) {
  if (!role) return std::nullopt;
  if (*role == "activation") return sb::InputRole::kActivation;
  if (*role == "weight") return sb::InputRole::kWeight;
  if (*role == "bias") return sb::InputRole::kBias;
  throw sb::Error("role '" + *role + "' is none of activation, weight, bias");
}

/// forward() runs what the model computes for inputs it can take: the exported model is
/// refused by a runtime for a tensor of another rank or fixed dimension, so the simulation is too.
void check_declared_shape(const at::Tensor& x, const sb::ValueInfo& in) {
  if (!in.has_shape || x.is_nested()) return;
  bool fits = x.dim() == static_cast<std::int64_t>(in.shape.size());
  for (std::size_t i = 0; fits && i < in.shape.size(); ++i)
    fits = in.shape[i].value < 0 || x.size(static_cast<std::int64_t>(i)) == in.shape[i].value;
  if (!fits)
    throw sb::Error("forward(): the input '" + sb::printable(in.name, 80) + "' has shape " + c10::str(x.sizes()) +
                    ", the model declares " + sb::shape_text(in.shape) + "; a runtime refuses it too");
}

/// The Session's steps report to `progress(done, total)` while calibrating; the others (bit
/// allocation) only check for Ctrl-C, as before any step.
sb::StepProgressFn calibration_progress(const py::object& progress) {
  const sb::ProgressFn user = progress_of(progress), quiet = progress_of(py::none());
  return [user, quiet](const std::string& step, std::int64_t done, std::int64_t total, const std::string&) {
    if (step.empty()) return;
    (step == "calibrating" ? user : quiet)(done, total);
  };
}

class PyQuantModel {
  /// Marks the model in use for one call: two Python threads running the same QuantModel at once
  /// (possible without the GIL) would race on its executor and quantizers.
  struct InUse {
    std::atomic<bool>& flag;
    explicit InUse(std::atomic<bool>& f) : flag(f) {
      if (flag.exchange(true))
        throw sb::Error("this QuantModel is running a call in another thread; use one QuantModel per thread");
    }
    ~InUse() { flag = false; }
  };

 public:
  PyQuantModel(py::handle model, py::handle config, py::handle calib) {
    config_ = config_of(config);
    session_ = std::make_shared<sb::Session>(config_);
    calib_ = data_source(calib, "python calib").with_images(config_.data);
    if (py::isinstance<PyModel>(model)) {
      source_ = model.cast<PyModel>();
    } else {
      const std::string path = path_of(model);
      source_ = PyModel{std::make_shared<sb::Model>(without_gil([&] { return session_->load(path, calib_); })), path};
    }
    // Prepared as `sparsebit quantize` would (Note [Session]).
    qm_ = std::make_unique<sb::QuantModel>(without_gil(
        [&] { return session_->quant_model(session_->prepare(copy_model(*source_.model), calib_), calib_); }));
  }

  py::dict calibrate(py::handle data, const py::object& progress) {
    InUse in_use(busy_);
    const sb::DataSource source = data_source(data, "python calibration data").with_images(config_.data);
    if (source.empty()) throw sb::Error("calibrate() needs data: an iterable of arrays, or a data path");
    const sb::StepProgressFn steps = calibration_progress(progress);
    stats_ = without_gil([&] { return session_->calibrate(*qm_, source, steps); });
    calibrated_ = true;
    return stats_dict();
  }

  /// numpy out, or torch tensors once init_qat() ran or _return_torch(True) asked; after
  /// init_qat() and with torch's grad mode on, the outputs carry autograd history through the
  /// quantizers (Note [One LibTorch]).
  py::object forward(py::args args, bool quantized) {
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
    if (quantized && !calibrated_) throw sb::Error("forward(quantized=True) needs calibrate() first");
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

  /// Quantization-aware training from Python: calibrates on `data`, makes weights and quantizer
  /// parameters trainable leaves (QuantModel::init_qat) and turns training mode on. Without
  /// data it starts from the calibration calibrate() did (the original toolkit's calibrate()
  /// then init_QAT()).
  py::dict init_qat(py::handle data, const py::object& progress) {
    InUse in_use(busy_);
    require_linked_torch("init_qat()");
    if (data.is_none()) {
      if (!calibrated_)
        throw sb::Error(
            "init_qat() without data starts from a calibration: call calibrate() first, or pass "
            "init_qat() the calibration data");
      without_gil([&] { qm_->init_qat(); });
      qat_ = torch_out_ = true;
      return stats_dict();
    }
    const sb::DataSource source = data_source(data, "python calibration data").with_images(config_.data);
    if (source.empty()) throw sb::Error("init_qat() needs calibration data: an iterable of arrays, or a data path");
    const sb::StepProgressFn steps = calibration_progress(progress);
    stats_ = without_gil([&] { return session_->init_qat(*qm_, source, steps); });
    calibrated_ = qat_ = torch_out_ = true;
    return stats_dict();
  }
  py::list named_parameters() {
    if (!qat_) throw sb::Error("named_parameters() needs init_qat() first: nothing is trainable before it");
    py::list l;
    for (const auto& [name, t] : qm_->named_parameters()) l.append(py::make_tuple(name, to_torch(t)));
    return l;
  }
  void return_torch(bool on) {
    if (on) require_linked_torch("forward() returning torch tensors");
    torch_out_ = on || qat_;
  }
  void train(bool on) { qm_->train(on); }
  bool training() const { return qm_->training(); }

  std::size_t set_bits(const std::string& glob, int bits, const std::optional<std::string>& role) {
    InUse in_use(busy_);
    const std::size_t n = qm_->set_bits(glob, bits, role_of(role));
    if (n > 0) calibrated_ = false;  // rebuilt observers: calibrate again
    return n;
  }
  std::size_t set_enabled(const std::string& glob, bool enabled, const std::optional<std::string>& role) {
    InUse in_use(busy_);
    return qm_->set_enabled(glob, enabled, role_of(role));
  }

  py::object report() {
    InUse in_use(busy_);
    return json_loads(qm_->report_json(stats_ ? &*stats_ : nullptr));
  }

  /// external_data: None or False: inline, or beside the model when it nears protobuf's 2 GiB
  /// limit (as the command without --external-data); True: every initializer of 1 KiB or more
  /// in PATH.data; a file name: the same, in that file beside the model.
  void export_onnx(py::handle path, py::handle external_data) {
    InUse in_use(busy_);
    if (!calibrated_) throw sb::Error("export() needs calibrate() first");
    const std::string out = path_of(path);
    namespace fs = std::filesystem;
    std::string location = sb::default_side_file(out);
    bool force = false;
    if (py::isinstance<py::bool_>(external_data)) {
      force = external_data.cast<bool>();
    } else if (!external_data.is_none()) {
      location = path_of(external_data);
      const fs::path l(location);
      if (l.is_absolute() || l.has_parent_path() || location == "." || location == "..")
        throw sb::Error("external_data '" + location +
                        "': give a file name; ONNX keeps external data beside the model, named relative to it");
      force = true;
    }
    const std::string data_path = (fs::path(out).parent_path() / location).string();
    sb::check_distinct_paths(source_files(), {{"path", out, true}, {"external_data", data_path}});
    without_gil([&] {
      std::string external;
      const std::string bytes = qm_->serialize(&external, location, force);
      sb::write_onnx_files(out, bytes, external, location);  // Note [External data side file]
      return 0;
    });
  }

  py::object profile(py::handle data, std::int64_t samples, const std::string& mode, py::handle output) {
    InUse in_use(busy_);
    if (mode != "both" && mode != "accumulated" && mode != "single")
      throw sb::Error("mode must be both, accumulated or single");
    if (!calibrated_) throw sb::Error("profile() needs calibrate() first");
    if (samples < 1) throw sb::Error("samples must be at least 1");
    const sb::DataSource source = data_source(data, "python profiling data").with_images(config_.data);
    if (source.empty()) throw sb::Error("profile() needs data: an iterable of arrays, or a data path");
    const std::string out = output.is_none() ? "" : path_of(output);
    if (!out.empty())
      sb::check_distinct_paths(source_files(), {{"output .json", out + ".json"}, {"output .html", out + ".html"}});
    const std::string json = without_gil([&] {
      std::unique_ptr<sb::AtomicFile> json_file, html_file;
      if (!out.empty()) {
        json_file = std::make_unique<sb::AtomicFile>(out + ".json");
        html_file = std::make_unique<sb::AtomicFile>(out + ".html");
      }
      sb::ProfileOptions opt;
      opt.samples = samples;
      opt.accumulated = mode != "single";
      opt.single = mode != "accumulated";
      opt.progress = progress_of(py::none());
      const sb::ProfileReport r = session_->profile(*qm_, source, opt);
      std::string text = sb::profile_json(r);
      if (json_file) {
        json_file->write(text);
        html_file->write(sb::profile_html(r));
        json_file->commit();
        html_file->commit();
      }
      return text;
    });
    return json_loads(json);
  }

  py::list inputs() const {
    py::list l;
    for (const auto& v : qm_->graph().inputs) l.append(value_info_dict(v));
    return l;
  }
  py::list outputs() const {
    py::list l;
    for (const auto& v : qm_->graph().outputs) l.append(value_info_dict(v));
    return l;
  }

 private:
  sb::Config config_;

  py::dict stats_dict() const {
    py::dict d;
    d["samples"] = stats_->samples;
    d["batches"] = stats_->batches;
    d["seconds"] = stats_->seconds;
    d["mode"] = stats_->mode;
    return d;
  }

  /// The files this model came from, which its outputs must not replace.
  std::vector<sb::PathRole> source_files() const {
    std::error_code ec;
    const bool config_file = std::filesystem::is_regular_file(config_.source, ec);
    return {{"the model", source_.path}, {"the config", config_file ? config_.source : ""}};
  }
  std::shared_ptr<sb::Session> session_;  // before qm_, which refers to its registry
  sb::DataSource calib_;
  PyModel source_;
  std::unique_ptr<sb::QuantModel> qm_;
  std::optional<sb::CalibrationStats> stats_;
  bool calibrated_ = false;
  bool qat_ = false;        // init_qat() ran: forward builds autograd graphs
  bool torch_out_ = false;  // forward() returns torch tensors (Note [One LibTorch])
  std::atomic<bool> busy_{false};
};

void set_threads(int n) {
  if (n < 0) throw sb::Error("threads must be 0 (all cores, shared among LOCAL_WORLD_SIZE workers) or more");
  at::set_num_threads(sb::choose_threads(n).threads);  // Note [Threads per process]
  stay_on_one_thread_if_forked();
}

void set_log_level(const std::string& level) {
  using sb::sdk::LogLevel;
  const std::map<std::string, LogLevel> levels = {{"debug", LogLevel::kDebug},
                                                  {"info", LogLevel::kInfo},
                                                  {"warning", LogLevel::kWarn},
                                                  {"error", LogLevel::kError}};
  auto it = levels.find(level);
  if (it == levels.end()) throw sb::Error("log level '" + level + "' is none of debug, info, warning, error");
  sb::sdk::log_to_stderr(it->second);
}

}  // namespace

PYBIND11_MODULE(_sparsebit, m) {
  m.doc() = "Sparsebit: quantize ONNX models to low-bit QDQ ONNX (the C++ library's pipeline)";
  sb::escape_log_messages();                        // the library's stderr logger, from import on
  pthread_atfork(nullptr, nullptr, on_fork_child);  // Note [Forked after a run]
  sb::install_memory_limit();                       // Note [Memory limit]; the cache stays the command's
  // Workers started by torchrun share the host's cores from the start (Note [Threads per process]).
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE"); local && std::atoi(local) > 1)
    at::set_num_threads(sb::choose_threads(0).threads);

  // Module-local: translators registered globally would also catch the C++ exceptions of other
  // pybind11 modules in the process (torch's).
  static py::exception<sb::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const py::error_already_set&) {
      throw;
    } catch (const sb::Error& e) {
      error(sb::one_line_message(e.what()).c_str());
    } catch (const c10::Error& e) {
      error(sb::printable(e.what_without_backtrace(), 4000).c_str());
    } catch (const sb::MemoryLimitExceeded& e) {
      error((e.what() + std::string("; try a smaller batch size, or sparsebit.set_memory_limit() if the machine "
                                    "has the memory"))
                .c_str());
    } catch (const std::bad_alloc&) {
      error("out of memory; try a smaller batch size");
    } catch (const std::exception& e) {
      error(sb::one_line_message(e.what()).c_str());
    }
  });

  m.attr("__version__") = SPARSEBIT_VERSION;
  m.attr("sdk_version") = std::to_string(sb::sdk::kSdkVersionMajor) + "." + std::to_string(sb::sdk::kSdkVersionMinor);
  m.attr("abi_version") = sb::sdk::kAbiVersion;

  py::class_<sb::Config>(m, "Config", "A Sparsebit config: the TOML's tables and keys")
      .def(py::init([](const py::dict& d) { return config_from_dict(d); }), py::arg("tables"),
           "From a dict with the TOML's tables and keys, checked as a TOML file is")
      .def_static(
          "from_file", [](py::handle p) { return sb::Config::from_file(path_of(p)); }, py::arg("path"))
      .def_static(
          "from_string", [](const std::string& text) { return sb::Config::from_string(text, "<config string>"); },
          py::arg("text"))
      .def_property_readonly("source", [](const sb::Config& c) { return c.source; })
      .def("__repr__", [](const sb::Config& c) { return "<sparsebit.Config from " + c.source + ">"; });

  py::class_<PyModel>(m, "Model", "A float ONNX model, imported and lifted to opset 13 or above")
      .def_property_readonly("path", [](const PyModel& m) { return m.path; })
      .def_property_readonly("inputs",
                             [](const PyModel& m) {
                               py::list l;
                               for (const auto& v : m.model->graph.inputs) l.append(value_info_dict(v));
                               return l;
                             })
      .def(
          "samples",
          [](const PyModel& m, py::handle data, py::handle config, std::int64_t count) {
            // The samples the model receives from `data` (images preprocessed as config's [data]
            // says), one array per input, each with its batch dimension of 1.
            std::optional<sb::DataConfig> images;
            if (!config.is_none()) images = config_of(config).data;
            const sb::DataSource source = data_source(data, "python data").with_images(images);
            if (source.empty()) throw sb::Error("samples() needs data: an iterable of arrays, or a data path");
            if (count < 0) throw sb::Error("count must be 0 (all) or more, got " + std::to_string(count));
            const auto& inputs = m.model->graph.inputs;
            std::vector<std::vector<at::Tensor>> got = without_gil([&] {
              auto dataset = source.open(inputs);
              sb::Batcher batches(*dataset, inputs, 1, count);
              std::vector<std::vector<at::Tensor>> out;
              while (auto b = batches.next()) out.push_back(b->inputs);
              return out;
            });
            py::list l;
            for (auto& sample : got) {
              if (sample.size() == 1) {
                l.append(to_numpy(sample[0]));
              } else {
                py::tuple t(sample.size());
                for (std::size_t i = 0; i < sample.size(); ++i) t[i] = to_numpy(sample[i]);
                l.append(t);
              }
            }
            return l;
          },
          py::arg("data"), py::kw_only(), py::arg("config") = py::none(), py::arg("count") = 0)
      .def_property_readonly("outputs",
                             [](const PyModel& m) {
                               py::list l;
                               for (const auto& v : m.model->graph.outputs) l.append(value_info_dict(v));
                               return l;
                             })
      .def_property_readonly("opset", [](const PyModel& m) { return m.model->graph.default_opset(); })
      .def_property_readonly("source_opset", [](const PyModel& m) { return m.model->meta.source_opset; })
      .def("op_histogram",
           [](const PyModel& m) {
             std::map<std::string, int> h;
             for (const auto* n : m.model->graph.nodes())
               ++h[n->domain.empty() || n->domain == "ai.onnx" ? n->op_type : n->domain + "." + n->op_type];
             return h;
           })
      .def("__repr__", [](const PyModel& m) {
        return "<sparsebit.Model " + m.path + ": " + std::to_string(m.model->graph.num_nodes()) + " nodes>";
      });

  m.def(
      "load",
      [](py::handle path, py::handle calib, py::handle config) {
        const std::string p = path_of(path);
        const sb::DataSource data = data_source(calib, "python calib");
        const sb::Config c = config.is_none() ? sb::Config() : config_of(config);  // read with the GIL
        auto model = without_gil([&] {
          const sb::Session session(c);
          return std::make_shared<sb::Model>(session.load(p, data));
        });
        return PyModel{model, p};
      },
      py::arg("path"), py::kw_only(), py::arg("calib") = py::none(), py::arg("config") = py::none());

  py::class_<PyQuantModel>(m, "QuantModel", "A model with quantizers placed by a config's backend and passes")
      .def(py::init<py::handle, py::handle, py::handle>(), py::arg("model"), py::arg("config"), py::kw_only(),
           py::arg("calib") = py::none())
      .def("calibrate", &PyQuantModel::calibrate, py::arg("data"), py::kw_only(), py::arg("progress") = py::none())
      .def("forward", &PyQuantModel::forward, py::kw_only(), py::arg("quantized") = true)
      .def("init_qat", &PyQuantModel::init_qat, py::arg("data") = py::none(), py::kw_only(),
           py::arg("progress") = py::none())
      .def("named_parameters", &PyQuantModel::named_parameters)
      .def("_train", &PyQuantModel::train, py::arg("mode"))
      .def("_return_torch", &PyQuantModel::return_torch, py::arg("on"))
      .def_property_readonly("training", &PyQuantModel::training)
      .def("set_bits", &PyQuantModel::set_bits, py::arg("nodes"), py::arg("bits"), py::kw_only(),
           py::arg("role") = py::none())
      .def("set_enabled", &PyQuantModel::set_enabled, py::arg("nodes"), py::arg("enabled"), py::kw_only(),
           py::arg("role") = py::none())
      .def("report", &PyQuantModel::report)
      .def("export", &PyQuantModel::export_onnx, py::arg("path"), py::kw_only(), py::arg("external_data") = py::none())
      .def("_profile", &PyQuantModel::profile, py::arg("data"), py::arg("samples"), py::arg("mode"), py::arg("output"))
      .def_property_readonly("inputs", &PyQuantModel::inputs)
      .def_property_readonly("outputs", &PyQuantModel::outputs);

  m.def("quantize", &quantize, py::arg("model"), py::arg("config"), py::kw_only(), py::arg("calib"), py::arg("output"),
        py::arg("report") = py::none(), py::arg("target") = py::none(), py::arg("target_strict") = false,
        py::arg("external_data") = false, py::arg("eval_data") = py::none(), py::arg("progress") = py::none());
  m.def("qat", &qat, py::arg("model"), py::arg("config"), py::kw_only(), py::arg("calib"), py::arg("train"),
        py::arg("output"), py::arg("epochs") = py::none(), py::arg("lr") = py::none(),
        py::arg("checkpoint") = py::none(), py::arg("resume") = true, py::arg("report") = py::none(),
        py::arg("progress") = py::none());
  m.def("prune", &prune, py::arg("model"), py::arg("config"), py::kw_only(), py::arg("output"),
        py::arg("calib") = py::none(), py::arg("train") = py::none(), py::arg("finetune_epochs") = 0,
        py::arg("report") = py::none(), py::arg("masked") = py::none(), py::arg("progress") = py::none());
  m.def("plugins", &plugins, py::kw_only(), py::arg("config") = py::none());
  m.def("set_threads", &set_threads, py::arg("threads"));
  m.def("_linked_torch", &linked_torch_imported);
  m.def(
      "threads", [] { return at::get_num_threads(); }, "The LibTorch threads calibration and training use");
  m.def("set_log_level", &set_log_level, py::arg("level"));
  m.def(
      "set_memory_limit",
      [](const py::object& size) {
        if (size.is_none()) return sb::set_memory_limit(0);
        if (py::isinstance<py::bool_>(size)) throw sb::Error("set_memory_limit: give bytes or a size such as '8GiB'");
        if (py::isinstance<py::int_>(size)) {
          const long long bytes = size.cast<long long>();
          if (bytes < (1LL << 20))
            throw sb::Error("set_memory_limit: " + std::to_string(bytes) +
                            " bytes is less than 1 MiB; no run fits in it");
          return sb::set_memory_limit(static_cast<std::size_t>(bytes));
        }
        sb::set_memory_limit(sb::parse_memory_size(size.cast<std::string>(), "set_memory_limit"));
      },
      py::arg("size"),
      "Largest CPU memory tensors may take: bytes, or '8GiB', '512MiB', '75%'; None restores the default "
      "(90% of this machine's memory). A node that would pass it is refused by name");
  m.def("memory_limit", &sb::memory_limit, "The memory limit in force, in bytes");
}
