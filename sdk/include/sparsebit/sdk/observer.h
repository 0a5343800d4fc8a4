#pragma once
/// \file
/// Observers watch the tensors a quantizer will see during calibration and turn them into
/// QParams. Streaming observers (minmax, moving average, histograms) must keep memory
/// independent of how many batches they see.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "sparsebit/sdk/options.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

struct ObserverContext {
  QSpec spec;
  const Options& options;
  std::string where;  ///< "input 0 of node 'conv1' (Conv)", for messages
};

class Observer {
 public:
  virtual ~Observer() = default;
  /// Called once per calibration batch (once in total for weights). Must not keep `x`.
  virtual void observe(const at::Tensor& x) = 0;
  /// Parameters from everything observed so far. Throws Error if nothing was observed.
  virtual QParams compute() = 0;
  virtual void reset() = 0;

  /// Note [Distributed observers]
  /// In a run spread over several processes (docs/DISTRIBUTED.md) each process observes its
  /// share of the calibration data; then every process gathers the states of all of them and
  /// merges them into a reset observer in rank order, so all compute the same parameters.
  /// state() is everything compute() needs, as CPU or device tensors (empty: nothing observed);
  /// merge() adds another process's state() to this one. Merging must give the parameters of one
  /// process that observed all the data (exactly, where the statistics allow it: minimum and
  /// maximum, histogram counts). An observer that returns false from mergeable() is fed all the
  /// data in every process instead (correct, not faster).
  virtual bool mergeable() const { return false; }
  virtual std::vector<at::Tensor> state() const { return {}; }
  virtual void merge(const std::vector<at::Tensor>& other) { (void)other; }
};

}  // namespace sparsebit
