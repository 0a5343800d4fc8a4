#pragma once
// Calibration over several processes (Note [Distributed runs], sparsebit/core/distributed.h):
// which data a process takes and how the observers' and quantizers' states come together.

#include <string>
#include <vector>

#include "sparsebit/core/distributed.h"
#include "sparsebit/core/quant_slots.h"

namespace sparsebit {

/// The group when calibration divides its batches between processes: every activation
/// observer (and every weight quantizer solving from its inputs) can merge its state; null for
/// one process, or when one cannot (then every process sees all the data, said once at info
/// level with the first such slot).
Distributed* dividing_group(const QuantSlots& slots, bool layer_passes, bool reconstruction);

/// Gathers the observer states of the activation slots among `slots` from every process and
/// merges them, in rank order, into reset observers; `observed` becomes the total. Every
/// process calls it with the same slots, in the same order.
void merge_observers(Distributed& group, const std::vector<QuantSlot*>& slots, const at::Device& device,
                     const std::string& what);

/// Sums a weight quantizer's accumulated inputs over the processes (Note [Weights solved from
/// layer inputs]); on GPUs through NCCL.
void merge_quantizer_inputs(Distributed& group, QuantSlot& slot, const std::string& what);

}  // namespace sparsebit
