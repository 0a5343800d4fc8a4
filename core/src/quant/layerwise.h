#pragma once
// The layerwise and asym calibration runner (Note [Layerwise runner] in quant_model.h).

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "quant/quant_model_access.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {

CalibrationStats run_layerwise(QuantModel& qm, Dataset& data, const ProgressFn& progress);

using Values = std::map<std::string, at::Tensor>;

class LayerwiseRunner {
 public:
  LayerwiseRunner(QuantModel& qm, Dataset& data, const ProgressFn& progress)
      : qm_(qm),
        slots_(QuantModelAccess::slots(qm)),
        ex_(qm.executor()),
        data_(data),
        progress_(progress),
        asym_(qm.config().calibration.mode == "asym"),
        nodes_(qm.graph().nodes()) {}

  CalibrationStats run();

  // For LayerState.
  const Graph& graph() const { return qm_.graph(); }
  const Node& node(std::size_t i) const { return *nodes_[i]; }
  std::size_t batches() const { return fp_.size(); }
  const Values& source(std::size_t b) const { return asym_ ? q_[b] : fp_[b]; }
  at::Tensor float_output(std::size_t i, std::size_t b, std::size_t k) const;
  std::vector<at::Tensor> quantized_outputs(std::size_t i, const Values& values);
  int bias_input(std::size_t i) const;
  void set_bias(std::size_t i, const at::Tensor& value);

 private:
  /// Node i's inputs as stored: constants, cached values of `values`, undefined where omitted.
  std::vector<at::Tensor> raw_inputs(std::size_t i, const Values& values) const;
  void finish_nested(std::size_t i);
  void cache_batches(CalibrationStats& stats);
  void run_quantized_stream(std::size_t i);
  struct RecordedStep;
  void reconstruct(std::size_t i, QuantSlot& w, CalibrationStats& stats);
  void solve_weight(std::size_t i, QuantSlot& w, CalibrationStats& stats);
  /// Node i's output error against the float model's over the cached batches, its weight
  /// slot `w` as its quantizer gives it now and the other inputs as the runner feeds them.
  double output_mse(std::size_t i, QuantSlot& w);
  void run_layer_passes(std::size_t i, CalibrationStats& stats);
  void release(std::size_t i);
  void account(CalibrationStats& stats) const;

  QuantModel& qm_;
  QuantSlots& slots_;
  Executor& ex_;
  Dataset& data_;
  const ProgressFn& progress_;
  const bool asym_;
  const std::vector<const Node*> nodes_;
  std::vector<Values> fp_, q_;      // per batch: float stream, quantized stream (asym only)
  std::vector<std::int64_t> rows_;  // samples in each batch
  std::map<std::string, int> counts_;
  std::set<std::string> outputs_;
  Distributed* group_ = nullptr;  // set when the batches are divided between processes
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace sparsebit
