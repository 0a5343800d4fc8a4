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

/// One range an observer offers for the host to choose among (Note [Range selection]).
struct RangeCandidate {
  std::string name;  ///< what it is ("minmax", "percentile 1e-4", "mse", "entropy"), for reports
  QParams params;
};

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

/// Note [Distributed observers]
/// In a run spread over several processes (docs/DISTRIBUTED.md) each process observes its
/// share of the calibration data; then every process gathers the states of all of them and
/// merges them into a reset observer in rank order, so all compute the same parameters. An
/// observer takes part by also deriving from MergeableObserver (Note [Capabilities] in
/// quantizer.h): state() is everything compute() needs, as CPU or device tensors (empty:
/// nothing observed); merge() adds another process's state() to this one. Merging must give the
/// parameters of one process that observed all the data (exactly, where the statistics allow
/// it: minimum and maximum, histogram counts). An observer without it is fed all the data in
/// every process instead (correct, not faster).
class MergeableObserver {
 public:
  virtual ~MergeableObserver() = default;
  virtual std::vector<at::Tensor> state() const = 0;
  virtual void merge(const std::vector<at::Tensor>& other) = 0;
};

/// Note [Range selection]
/// An activation observer may offer several ranges instead of deciding alone, by also deriving
/// from OffersRanges: candidates() is called after the last observe() and before compute().
/// When it returns two or more, the host (in streaming calibration) runs each consuming layer
/// on a few calibration batches with the input quantized on each candidate's grid and keeps the
/// candidate whose layer output is closest to the float layer's (least squared error), where
/// the model's output on held-out samples confirms it; compute() is the default that stands
/// otherwise, and the choice where the host does not select (layerwise modes, weights), and
/// must be one of the candidates. Without it, compute() alone decides.
class OffersRanges {
 public:
  virtual ~OffersRanges() = default;
  virtual std::vector<RangeCandidate> candidates() = 0;
};

}  // namespace sparsebit
