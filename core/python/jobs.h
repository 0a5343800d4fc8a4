#pragma once
// The pipeline's jobs as Python functions: sparsebit.quantize, qat, prune and plugins
// (docs/PYTHON.md), each the command of the same name through the same job.

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

namespace sparsebit::python {

namespace py = pybind11;

py::object quantize(py::handle model, py::handle config, py::handle calib, py::handle output, py::handle report,
                    const std::optional<std::string>& target, bool target_strict, bool external_data,
                    py::handle eval_data, const py::object& progress);
py::object qat(py::handle model, py::handle config, py::handle calib, py::handle train, py::handle output,
               std::optional<int> epochs, std::optional<double> lr, py::handle checkpoint, bool resume,
               py::handle report, const py::object& progress);
py::object prune(py::handle model, py::handle config, py::handle output, py::handle calib, py::handle train,
                 int finetune_epochs, py::handle report, py::handle masked, const py::object& progress);
/// The plugins a config (or the default search) finds, with their status.
py::list plugins(py::handle config);

}  // namespace sparsebit::python
