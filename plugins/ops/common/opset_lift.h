#pragma once
// LiftsOpset rules (Note [Opset lifting]) shared by the op plugins of this repository.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/sdk/op_traits.h"

namespace sparsebit::ops {

/// An op with the traits `Traits...` whose meaning did not change from opset 7 on.
template <class... Traits>
using SameMeaning = TraitsOf<SameMeaningAcrossOpsets, Traits...>;

/// From opset `Version` the 'axes' attribute is input 1 (Squeeze, Unsqueeze, the Reduce* ops).
template <std::int64_t Version>
class AxesBecomeInput : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {Version}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override { c.attribute_to_input(n, "axes", 1); }
};

/// The ATen type of a float ONNX element type; float when unknown (ops that took float
/// attributes before their inputs accept float16, float and double only).
inline at::ScalarType float_type_of(std::int32_t onnx_type) {
  switch (onnx_type) {
    case 10: return at::kHalf;
    case 11: return at::kDouble;
    case 16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

/// Removes outputs from `keep` on, refusing when one of them is read: `why` says what it was.
inline void drop_outputs(LiftContext& c, Node& n, std::size_t keep, const std::string& why) {
  for (std::size_t k = keep; k < n.outputs.size(); ++k)
    if (c.read_elsewhere(n.outputs[k])) c.refuse(n, "its output '" + n.outputs[k] + "' " + why + " and is read");
  if (n.outputs.size() > keep) {
    n.outputs.resize(keep);
    c.note(n, "unused training outputs removed");
  }
}

}  // namespace sparsebit::ops
