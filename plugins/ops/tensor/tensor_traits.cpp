// What the tensor plugin's ops tell the passes: how channels flow through them (Note [Channel
// flow]) and how older opsets lift to the ones the modules implement.

#include <ATen/ATen.h>

#include <optional>

#include "channel_flow.h"
#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "tensor_ops.h"

namespace sparsebit::ops {

namespace {

/// Transpose: the channel axis moves to where `perm` puts it (reversed without `perm`).
class TransposeChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const auto perm = q.node.attr_ints("perm");
    for (std::size_t k = 0; k < perm.size(); ++k)
      if (perm[k] == q.axis) return carried_to_output(static_cast<std::int64_t>(k));
    const std::int64_t rank = tracked_rank(q);
    if (perm.empty() && rank >= 0) return carried_to_output(rank - 1 - q.axis);
    return {};
  }
};

/// Squeeze and Unsqueeze: the channel axis shifts past the axes removed or inserted before it.
class SqueezeChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    const auto* out = q.node.outputs.empty() ? nullptr : q.shape(q.node.outputs[0]);
    if (q.input != 0 || rank < 0 || !out) return {};
    const bool squeeze = q.node.op_type == "Squeeze";
    const std::int64_t out_rank = static_cast<std::int64_t>(out->size());
    const auto axes = axes_of(q, "axes", 1, squeeze ? rank : out_rank);  // Unsqueeze's count in the output
    if (!axes) return {};
    if (squeeze) {
      if (axes->empty() || std::count(axes->begin(), axes->end(), q.axis)) return {};
      return carried_to_output(q.axis -
                               std::count_if(axes->begin(), axes->end(), [&](std::int64_t a) { return a < q.axis; }));
    }
    std::vector<bool> inserted(static_cast<std::size_t>(out_rank), false);
    for (std::int64_t p : *axes) {
      if (p < 0 || p >= out_rank) return {};
      inserted[static_cast<std::size_t>(p)] = true;
    }
    std::int64_t seen = -1;
    for (std::int64_t p = 0; p < out_rank; ++p)
      if (!inserted[static_cast<std::size_t>(p)] && ++seen == q.axis) return carried_to_output(p);
    return {};
  }
};

/// Pad: channels pass when nothing is padded along their axis.
class PadChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0 || q.node.has_input(3)) return {};  // explicit axes: not read here
    std::vector<std::int64_t> pads;
    if (q.node.has_attr("pads")) pads = q.node.attr_ints("pads");
    else if (auto c = q.node.has_input(1) ? q.constant(q.node.inputs[1]) : std::nullopt) pads = int_values(*c);
    if (static_cast<std::int64_t>(pads.size()) != 2 * rank || pads[q.axis] != 0 || pads[q.axis + rank] != 0) return {};
    return carried_to_output(q.axis);
  }
};

/// Slice: channels pass when the channel axis is not sliced.
class SliceChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0) return {};
    std::optional<std::vector<std::int64_t>> axes;
    if (q.node.has_input(3)) {
      axes = axes_of(q, "", 3, rank);
    } else {  // default axes: the first len(starts)
      const auto* starts = q.node.has_input(1) ? q.shape(q.node.inputs[1]) : nullptr;
      if (!starts || starts->size() != 1) return {};
      axes = std::vector<std::int64_t>();
      for (std::int64_t a = 0; a < (*starts)[0]; ++a) axes->push_back(a);
    }
    if (!axes || std::count(axes->begin(), axes->end(), q.axis)) return {};
    return carried_to_output(q.axis);
  }
};

/// Split along another axis: every output carries the channels.
class SplitChannels : public ChannelFlow {
 public:
  ChannelFlowAnswer channel_flow(const ChannelQuery& q) const override {
    const std::int64_t rank = tracked_rank(q);
    if (q.input != 0 || rank < 0 || normalized_axis(q.node.attr_int("axis", 0), rank) == q.axis) return {};
    ChannelFlowAnswer a;
    for (std::size_t k = 0; k < q.node.outputs.size(); ++k) a.outputs.push_back({k, q.axis});
    return a;
  }
};

// 10: the mask output became bool (a model reading the old one cannot be lifted); 12: the ratio
// became an input, and an inference-mode Dropout is the identity whatever the ratio.
class DropoutLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {10, 12}; }
  void lift(LiftContext& c, Node& n, std::int64_t version) const override {
    if (version == 10) return drop_outputs(c, n, 1, "(the mask) changes type from the data's to bool at opset 10");
    if (!n.has_attr("ratio")) return;
    n.attributes.erase("ratio");
    c.note(n, "'ratio' attribute removed (inference mode)");
  }
};

// From 11 on pads and the constant value are inputs.
class PadLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {11}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (!n.has_attr("pads")) c.refuse(n, "it has no 'pads' attribute");
    const double value = n.attr_float("value", 0);
    c.attribute_to_input(n, "pads", 1);
    if (!n.has_attr("value")) return;
    n.attributes.erase("value");
    if (value == 0) return;
    c.set_input(n, 2, c.constant(n, "value", at::scalar_tensor(value, float_type_of(c.elem_type(n.inputs.at(0))))));
    c.note(n, "'value' attribute -> input 2");
  }
};

// 13: the sizes became input 1; 18: an equal split needs num_outputs.
class SplitLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {13, 18}; }
  void lift(LiftContext& c, Node& n, std::int64_t version) const override {
    if (version == 13) return c.attribute_to_input(n, "split", 1);
    if (n.has_input(1) || n.has_attr("num_outputs")) return;
    n.attributes["num_outputs"] = Attribute::of_int(static_cast<std::int64_t>(n.outputs.size()));
    c.note(n, "equal split -> num_outputs = " + std::to_string(n.outputs.size()));
  }
};

// From 10 on starts, ends and axes are inputs.
class SliceLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {10}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    if (!n.has_attr("starts") || !n.has_attr("ends")) c.refuse(n, "it lacks the 'starts' or 'ends' attribute");
    c.attribute_to_input(n, "starts", 1);
    c.attribute_to_input(n, "ends", 2);
    c.attribute_to_input(n, "axes", 3);
  }
};

// Scatter was renamed ScatterElements at 11.
class ScatterLift : public LiftsOpset {
 public:
  std::vector<std::int64_t> lift_versions() const override { return {11}; }
  void lift(LiftContext& c, Node& n, std::int64_t) const override {
    n.op_type = "ScatterElements";
    c.note(n, "Scatter -> ScatterElements");
  }
};

}  // namespace

void register_traits(Registrar& r) {
  for (const char* op : {"Identity", "Cast"}) r.add_op_traits<SameMeaning<SameChannels>>(op);
  r.add_op_traits<TraitsOf<SameChannels, DropoutLift>>("Dropout");
  r.add_op_traits<SameMeaning<TransposeChannels>>("Transpose");
  r.add_op_traits<TraitsOf<SqueezeChannels, AxesBecomeInput<13>>>("Squeeze");
  r.add_op_traits<TraitsOf<SqueezeChannels, AxesBecomeInput<13>>>("Unsqueeze");
  r.add_op_traits<TraitsOf<PadChannels, PadLift>>("Pad");
  r.add_op_traits<TraitsOf<SliceChannels, SliceLift>>("Slice");
  r.add_op_traits<TraitsOf<SplitChannels, SplitLift>>("Split");
  r.add_op_traits<ScatterLift>("Scatter");
  for (const char* op : {"Flatten",  "Reshape",   "Concat",          "Gather",          "GatherElements",
                         "GatherND", "ScatterND", "ScatterElements", "Expand",          "Tile",
                         "Shape",    "Size",      "CastLike",        "ConstantOfShape", "Range",
                         "NonZero",  "OneHot",    "Trilu",           "Compress",        "ReverseSequence",
                         "EyeLike",  "Unique",    "Constant",        "DepthToSpace",    "SpaceToDepth"})
    r.add_op_traits<SameMeaning<>>(op);
}

}  // namespace sparsebit::ops
