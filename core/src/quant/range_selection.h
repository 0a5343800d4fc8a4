#pragma once
// The host's side of Note [Range selection] (observer.h): after streaming calibration, each
// quantized input whose observer offered several ranges gets the one under which its consuming
// layer's output is closest to float (not part of the public headers).
//
// Note [Choosing ranges by the consuming layer]
// The float model runs on the first calibration samples (kept during calibration: at most
// [calibration] range_samples, so memory does not grow with the data). At each node with such an
// input, the node runs once on its float inputs (the reference), then once per candidate with
// that input fake-quantized on the candidate's grid and its weights on theirs (the layer as it
// will be deployed); other activation inputs stay float, so each input is judged on its own.
// The output errors, relative per slice (Note [Relative layer error] in layer_error.h), add up
// over the samples (and over every run of a node inside a control-flow body); the least wins,
// the first offered on ties. In a distributed run every process evaluates the same first
// samples, and the errors are summed over the processes as well, so that float differences
// between devices cannot split the choice. Cost: one float pass over those samples plus one run
// of each such node per candidate.
//
// Note [One grid per tensor]
// A tensor read by several quantized inputs (a residual's skip and its branch, a convolution's
// output read by two layers) gets one choice for all of them: the candidate whose errors, summed
// over those readers' layers, are least. Their observers saw the same data, so the same choice
// gives the same grid, and the export writes one QuantizeLinear for the tensor. A runtime fuses a
// producer into its integer kernel only when its output goes to a single QuantizeLinear (ONNX
// Runtime's QDQ selectors require every output edge to end in a Q node), so two grids on one
// tensor would leave the producer in float.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sparsebit/core/distributed.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/quant_slots.h"

namespace sparsebit::detail {

struct RangeSelection {
  std::size_t inputs = 0;  ///< quantized inputs that chose among candidates
  std::int64_t samples = 0;
  double seconds = 0;
  std::map<std::string, std::size_t> chosen;  ///< candidate name -> how many inputs took it
};

/// Chooses among every slot's range_candidates (Note [Choosing ranges by the consuming layer])
/// on `batches` (graph input name -> tensor), initializes the quantizers and recomputes the
/// dependent bias scales; clears the candidates.
RangeSelection select_ranges(Executor& executor, QuantSlots& slots,
                             const std::vector<std::map<std::string, at::Tensor>>& batches, std::int64_t samples,
                             Distributed* group);

}  // namespace sparsebit::detail
