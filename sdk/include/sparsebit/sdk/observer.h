#pragma once
/// \file
/// Observers watch the tensors a quantizer will see during calibration and turn them into
/// QParams. Streaming observers (minmax, moving average, histograms) must keep memory
/// independent of how many batches they see.

#include <ATen/core/Tensor.h>

#include <string>

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
};

}  // namespace sparsebit
