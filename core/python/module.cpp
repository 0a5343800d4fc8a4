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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "calls.h"
#include "convert.h"
#include "jobs.h"
#include "quant_model.h"
#include "torch_bridge.h"
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
