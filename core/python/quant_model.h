#pragma once
// sparsebit.Model and sparsebit.QuantModel (docs/PYTHON.md): a float model read once, and a
// Session's steps one call at a time for notebooks and training loops. module.cpp binds them.

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/session.h"

namespace sparsebit::python {

namespace py = pybind11;

/// A float model as sparsebit.load_model returns it, shared by the QuantModels made from it.
struct PyModel {
  std::shared_ptr<const Model> model;
  std::string path;
};

/// {"name", "type", "shape"} of a graph input or output; open dimensions as their name or None.
py::dict value_info_dict(const ValueInfo& v);

class PyQuantModel {
 public:
  /// `model`: a sparsebit.Model or a path; prepared as `sparsebit quantize` would (Note [Session]).
  PyQuantModel(py::handle model, py::handle config, py::handle calib);

  py::dict calibrate(py::handle data, const py::object& progress);
  /// numpy out, or torch tensors once init_qat() ran or _return_torch(True) asked; after
  /// init_qat() and with torch's grad mode on, the outputs carry autograd history through the
  /// quantizers (Note [One LibTorch]).
  py::object forward(py::args args, bool quantized);
  /// Quantization-aware training from Python: calibrates on `data`, makes weights and quantizer
  /// parameters trainable leaves (QuantModel::init_qat) and turns training mode on. Without
  /// data it starts from the calibration calibrate() did (the original toolkit's calibrate()
  /// then init_QAT()).
  py::dict init_qat(py::handle data, const py::object& progress);
  py::list named_parameters();
  void return_torch(bool on);
  void train(bool on) { qm_->train(on); }
  bool training() const { return qm_->training(); }

  std::size_t set_bits(const std::string& glob, int bits, const std::optional<std::string>& role);
  std::size_t set_enabled(const std::string& glob, bool enabled, const std::optional<std::string>& role);
  py::object report();
  /// external_data: None or False: inline, or beside the model when it nears protobuf's 2 GiB
  /// limit (as the command without --external-data); True: every initializer of 1 KiB or more
  /// in PATH.data; a file name: the same, in that file beside the model.
  void export_onnx(py::handle path, py::handle external_data);
  py::object profile(py::handle data, std::int64_t samples, const std::string& mode, py::handle output);
  py::list inputs() const;
  py::list outputs() const;

 private:
  /// Marks the model in use for one call: two Python threads running the same QuantModel at once
  /// (possible without the GIL) would race on its executor and quantizers.
  struct InUse {
    std::atomic<bool>& flag;
    explicit InUse(std::atomic<bool>& f);
    ~InUse() { flag = false; }
  };

  py::dict stats_dict() const;
  /// The files this model came from, which its outputs must not replace.
  std::vector<PathRole> source_files() const;

  Config config_;
  std::shared_ptr<Session> session_;  // before qm_, which refers to its registry
  DataSource calib_;
  PyModel source_;
  std::unique_ptr<QuantModel> qm_;
  std::optional<CalibrationStats> stats_;
  std::optional<RoundingCheck> rounding_check_;
  bool calibrated_ = false;
  bool qat_ = false;        // init_qat() ran: forward builds autograd graphs
  bool torch_out_ = false;  // forward() returns torch tensors (Note [One LibTorch])
  std::atomic<bool> busy_{false};
};

}  // namespace sparsebit::python
