#pragma once
// The host's side of Note [Range selection] (observer.h): after streaming calibration, each
// quantized input whose observer offered several ranges gets the one under which its consuming
// layer's output is closest to float, where the model's output on held-out samples confirms it
// (not part of the public headers).
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
// Note [Choices judged at the output]
// A layer's own error ignores what follows it: a clip that serves the layer best on the samples
// it was chosen on may hurt the model's output, or fit those samples and not the next (a tail cut
// at 1e-3 of eight samples is cut where their tail happens to fall). So the choices are judged
// on held-out samples (the next 2 x range_samples of the calibration data, not those they were
// chosen on) by the model's output, everything quantized as it will be deployed. The observer's
// own range (what compute() returned: for `auto` the one of least squared error on the tensor
// itself) is the default; the departures from it, most helpful to their layer first, are tried
// as prefixes (none, a quarter, half, three quarters, all), and the prefix of least output error
// (squared error over the energy of the float outputs, summed over the held-out samples: the
// SQNR's measure, which low-energy samples cannot dominate) is kept, the default on ties.
// Without held-out samples nothing can be judged and every input keeps the default. Cost: one
// float and at most five quantized passes over those samples.
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

using Feeds = std::map<std::string, at::Tensor>;  ///< graph input name -> tensor

struct RangeSelection {
  std::size_t inputs = 0;  ///< quantized inputs that chose among candidates
  std::int64_t samples = 0;
  double seconds = 0;
  std::map<std::string, std::size_t> chosen;  ///< candidate name -> how many inputs took it
  /// Note [Choices judged at the output]: held-out samples, inputs whose layer preferred
  /// another range than the observer's own and how many of them kept it, the output error
  /// (relative, mean over the samples) with the defaults and as kept.
  std::int64_t judged_samples = 0;
  std::size_t departures = 0, kept = 0;
  double output_error_default = 0, output_error_kept = 0;
};

/// Chooses among every slot's range_candidates (Note [Choosing ranges by the consuming layer])
/// on `batches`, initializes the quantizers and recomputes the dependent bias scales; clears the
/// candidates. With `judge` (held-out batches of `judged` samples), the layers' choices stand only where the model's
/// output on them confirms them (Note [Choices judged at the output]); without, each input takes
/// its layer's choice.
RangeSelection select_ranges(Executor& executor, QuantSlots& slots, const std::vector<Feeds>& batches,
                             std::int64_t samples, const std::vector<Feeds>* judge, std::int64_t judged,
                             Distributed* group);

}  // namespace sparsebit::detail
