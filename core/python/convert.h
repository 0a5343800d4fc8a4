#pragma once
// Values between Python and the pipeline (convert.cpp): arrays and tensors, data sources, configs.

#include <ATen/core/Tensor.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/core/session.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit::python {

namespace py = pybind11;

/// One item of the user's data as the model's inputs: a dict by input name, a sequence in input
/// order, or one array for a model of one input; numpy, DLPack or __array__ values.
std::vector<at::Tensor> inputs_of(py::handle item, const std::vector<ValueInfo>& inputs, const std::string& where);
/// A tensor as a numpy array (copied to the host).
py::array to_numpy(at::Tensor t);
/// A path as Python's open() takes it: str, bytes or os.PathLike, in the file system's encoding
/// (so names that are not UTF-8 survive); an embedded NUL is refused, not cut short.
std::string path_of(py::handle p);
/// Data given to a call: a path (str, bytes or os.PathLike) as the CLI takes it, or a Python
/// iterable, read afresh by each step that opens the source (Note [Data sources]).
DataSource data_source(py::handle data, const std::string& label);
/// A config from a dict of tables, as the TOML file would hold them.
Config config_from_dict(const py::dict& d);
/// A Config, a dict, or the path of a TOML file.
Config config_of(py::handle c);

}  // namespace sparsebit::python
