#pragma once
// What the core's calibration runners (layerwise, asym, single layer), the accuracy target and
// the latency search use of a QuantModel beyond its public API: its quantizer slots, its layer
// passes, and replacing a node's constant input. Not for hosts: they drive the model through
// quant_model.h.

#include <cstddef>
#include <vector>

#include "sparsebit/core/passes.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/quant_slots.h"

namespace sparsebit {

struct QuantModelAccess {
  static QuantSlots& slots(QuantModel& qm) { return *qm.slots_; }
  static const QuantSlots& slots(const QuantModel& qm) { return *qm.slots_; }
  /// The kLayer passes of the schedule, which the layerwise runner calls at each node.
  static std::vector<LayerPass>& layer_passes(QuantModel& qm) { return qm.layer_passes_; }
  static void set_constant_input(QuantModel& qm, std::size_t node, std::size_t input, const at::Tensor& value) {
    qm.set_constant_input(node, input, value);
  }
};

}  // namespace sparsebit
