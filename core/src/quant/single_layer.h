#pragma once
// Runs of the model with one layer quantized at a time, shared by the profiler's single-layer
// view and the accuracy target's sensitivity ranking (not part of the public headers).
//
// Note [Single-layer runs]
// For each sample, every node runs once in float and all values are kept. Then, for each
// layer, only the nodes that read a value the layer changed run again: the layer's node with
// its quantizers forced on (weights, activations, bias), then whatever depends on its outputs.
// Cost per layer is the layer and what lies downstream of it, not the whole model: the first
// layers of a network cost nearly a full pass, the last ones almost nothing. A layer inside a
// control-flow body reruns its enclosing top-level node with the quantizers of that body node
// on (Note [Flat node numbering]). Memory: the float values of one sample (or batch) at once.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "sparsebit/core/quant_model.h"

namespace sparsebit::detail {

/// For every input set of `samples` and every layer of `layers` (flat node numbers, in any
/// order): the graph outputs with only that layer quantized; sink(layer position, sample,
/// outputs). `sample_done(sample)` after each sample's layers.
void single_layer_outputs(QuantModel& qm, const std::vector<std::vector<at::Tensor>>& samples,
                          const std::vector<std::size_t>& layers,
                          const std::function<void(std::size_t, std::size_t, const std::vector<at::Tensor>&)>& sink,
                          const std::function<void(std::size_t)>& sample_done = {});

}  // namespace sparsebit::detail
