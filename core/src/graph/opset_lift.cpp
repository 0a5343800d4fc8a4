// Opset lifting by per-op rules (Note [Opset lifting] in opset_lift.h).
#include "sparsebit/core/opset_lift.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "graph/value_facts.h"

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {
namespace {

using detail::kBool;
using detail::kFloat;
using detail::kInt64;
using detail::run_sample;

// -- the rules ----------------------------------------------------------------------------------

/// Ops whose meaning did not change from opset 7 to 21 (their new versions widened types or
/// added attributes and inputs whose defaults keep the old behaviour).
// A table of op names, packed (not one per line):
// clang-format off
const std::set<std::string> kUnchanged = {
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "AveragePool",
    "Bernoulli", "BitShift", "Cast", "CastLike", "Ceil", "Celu", "Compress", "Concat", "Constant", "ConstantOfShape",
    "Conv", "ConvInteger", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "DequantizeLinear", "Det", "Div",
    "DynamicQuantizeLinear", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike", "Flatten", "Floor", "GRU",
    "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater",
    "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LSTM",
    "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LpNormalization", "LpPool", "MatMul",
    "MatMulInteger", "Max", "MaxPool", "MaxRoiPool", "MaxUnpool", "Mean", "MeanVarianceNormalization", "Min", "Mish",
    "Mod", "Mul", "Multinomial", "Neg", "NonMaxSuppression", "NonZero", "Not", "OneHot", "Or", "PRelu", "Pow",
    "QLinearConv", "QLinearMatMul", "QuantizeLinear", "RNN", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Range", "Reciprocal", "Relu", "Reshape", "ReverseSequence", "Round", "ScatterElements",
    "ScatterND", "Selu", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
    "SequenceLength", "ConcatFromSequence", "SplitToSequence", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
    "Size", "Softplus", "Softsign", "SpaceToDepth", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile",
    "Transpose", "Trilu", "Unique", "Where", "Xor"};
// clang-format on

class Lifter;
using Rule = std::function<void(Lifter&, Node&)>;
struct Step {
  std::int64_t version;  ///< the first opset with the new meaning
  Rule apply;
};

class Lifter {
 public:
  Lifter(Graph& g, const ValueFacts& facts, std::int64_t target, LiftReport& report)
      : g_(g), facts_(facts), target_(target), report_(report) {}

  Graph& graph() { return g_; }
  std::int64_t target() const { return target_; }

  const ValueFact* fact(const std::string& value) const {
    auto it = facts_.find(value);
    return it == facts_.end() ? nullptr : &it->second;
  }
  std::int64_t rank(const std::string& value) const {
    if (auto it = g_.initializers.find(value); it != g_.initializers.end()) return it->second.dim();
    const ValueFact* f = fact(value);
    return f ? f->rank : -1;
  }
  std::int32_t elem_type(const std::string& value) const {
    if (auto it = g_.initializers.find(value); it != g_.initializers.end())
      return onnx_type_of(it->second.scalar_type());
    const ValueFact* f = fact(value);
    return f ? f->elem_type : 0;
  }
  std::string constant(const Node& n, const std::string& what, at::Tensor value) {
    const std::string name = g_.unique_name(n.name + "_" + what);
    g_.initializers[name] = std::move(value);
    return name;
  }
  /// Moves an ints attribute to input `index` as an int64 initializer (inputs padded with "").
  void attribute_to_input(Node& n, const char* attr, std::size_t index) {
    if (!n.has_attr(attr)) return;
    const auto values = n.attr_ints(attr);
    n.attributes.erase(attr);
    set_input(n, index, constant(n, attr, at::tensor(values, at::kLong)));
    note(n, std::string("'") + attr + "' attribute -> input " + std::to_string(index));
  }
  void set_input(Node& n, std::size_t index, const std::string& name) {
    if (n.inputs.size() <= index) n.inputs.resize(index + 1);
    n.inputs[index] = name;
  }
  bool read_elsewhere(const std::string& value) {
    return !value.empty() && (!g_.consumers(value).empty() || g_.is_graph_output(value));
  }
  void note(const Node& n, const std::string& what) { report_.rewrites.push_back(n.describe() + ": " + what); }
  [[noreturn]] void refuse(const Node& n, const std::string& why) const {
    throw Error(n.describe() + " cannot be lifted from opset " + std::to_string(report_.from) + " to " +
                std::to_string(target_) + ": " + why);
  }

 private:
  Graph& g_;
  const ValueFacts& facts_;
  std::int64_t target_;
  LiftReport& report_;
};

at::ScalarType scalar_type_of(std::int32_t onnx_type) {
  switch (onnx_type) {
    case 10: return at::kHalf;
    case 11: return at::kDouble;
    case 16: return at::kBFloat16;
    default: return at::kFloat;
  }
}

// Before 13 the op flattened x to 2-D at `axis` and normalized over the whole tail; from 13 on
// it normalizes along `axis` alone. The two agree when the axis is the last one.
void lift_softmax(Lifter& l, Node& n) {
  const std::int64_t axis = n.attr_int("axis", 1);
  const std::int64_t rank = l.rank(n.inputs.at(0));
  if (axis == -1 || (rank >= 0 && axis == rank - 1)) {
    n.attributes["axis"] = Attribute::of_int(-1);
    l.note(n, "axis " + std::to_string(axis) + " is the last axis; unchanged");
    return;
  }
  Graph& g = l.graph();
  const std::string x = n.inputs[0], out = n.outputs.at(0);
  Node shape;
  shape.op_type = "Shape";
  shape.name = g.unique_name(n.name + "_input_shape");
  shape.inputs = {x};
  shape.outputs = {g.unique_name(x + "_shape")};
  Node flat;
  flat.op_type = "Flatten";
  flat.name = g.unique_name(n.name + "_flatten");
  flat.inputs = {x};
  flat.outputs = {g.unique_name(x + "_2d")};
  flat.attributes["axis"] = Attribute::of_int(axis);
  Node back;
  back.op_type = "Reshape";
  back.name = g.unique_name(n.name + "_restore_shape");
  const std::string flat_out = g.unique_name(out + "_2d");
  back.inputs = {flat_out, shape.outputs[0]};
  back.outputs = {out};
  n.inputs[0] = flat.outputs[0];
  n.outputs[0] = flat_out;
  n.attributes["axis"] = Attribute::of_int(-1);
  g.insert_before(&n, std::move(shape));
  g.insert_before(&n, std::move(flat));
  g.insert_after(&n, std::move(back));
  l.note(n, "axis " + std::to_string(axis) +
                (rank >= 0 ? " of a rank-" + std::to_string(rank) + " input" : " of an input of unknown rank") +
                " is not the last axis; rewritten as Flatten -> " + n.op_type + " -> Reshape");
}

void lift_clip(Lifter& l, Node& n) {
  if (!n.has_attr("min") && !n.has_attr("max")) return;
  std::int32_t type = l.elem_type(n.inputs.at(0));
  if (type == 0) type = kFloat;  // Clip before 11 accepts float16/float/double only; float unless told
  const at::ScalarType st = scalar_type_of(type);
  if (n.has_attr("min")) l.set_input(n, 1, l.constant(n, "min", at::scalar_tensor(n.attr_float("min", 0), st)));
  if (n.has_attr("max")) l.set_input(n, 2, l.constant(n, "max", at::scalar_tensor(n.attr_float("max", 0), st)));
  n.attributes.erase("min");
  n.attributes.erase("max");
  l.note(n, "min/max attributes -> inputs");
}

void lift_pad(Lifter& l, Node& n) {
  if (!n.has_attr("pads")) l.refuse(n, "it has no 'pads' attribute");
  const double value = n.attr_float("value", 0);
  l.attribute_to_input(n, "pads", 1);
  if (n.has_attr("value")) {
    n.attributes.erase("value");
    if (value != 0) {
      std::int32_t type = l.elem_type(n.inputs.at(0));
      if (type == 0) type = kFloat;  // Pad before 11 accepts float16/float/double only
      l.set_input(n, 2, l.constant(n, "value", at::scalar_tensor(value, scalar_type_of(type))));
      l.note(n, "'value' attribute -> input 2");
    }
  }
}

void lift_slice(Lifter& l, Node& n) {
  if (!n.has_attr("starts") || !n.has_attr("ends")) l.refuse(n, "it lacks the 'starts' or 'ends' attribute");
  l.attribute_to_input(n, "starts", 1);
  l.attribute_to_input(n, "ends", 2);
  l.attribute_to_input(n, "axes", 3);
}

void lift_topk(Lifter& l, Node& n) {
  if (!n.has_attr("k")) l.refuse(n, "it has no 'k' attribute");
  const std::int64_t k = n.attr_int("k", 0);
  n.attributes.erase("k");
  l.set_input(n, 1, l.constant(n, "k", at::tensor(std::vector<std::int64_t>{k}, at::kLong)));
  l.note(n, "'k' attribute -> input 1");
}

void lift_split_13(Lifter& l, Node& n) { l.attribute_to_input(n, "split", 1); }

void lift_split_18(Lifter& l, Node& n) {
  if (n.has_input(1) || n.has_attr("num_outputs")) return;
  // Split-18 needs either sizes or num_outputs; the equal split of earlier versions is the latter.
  n.attributes["num_outputs"] = Attribute::of_int(static_cast<std::int64_t>(n.outputs.size()));
  l.note(n, "equal split -> num_outputs = " + std::to_string(n.outputs.size()));
}

void lift_axes(Lifter& l, Node& n) { l.attribute_to_input(n, "axes", 1); }

void lift_upsample(Lifter& l, Node& n) {
  std::string scales;
  if (n.has_attr("scales")) {  // Upsample-7
    const auto v = n.attr_floats("scales");
    scales = l.constant(n, "scales", at::tensor(std::vector<float>(v.begin(), v.end()), at::kFloat));
    n.attributes.erase("scales");
  } else if (n.has_input(1)) {  // Upsample-9
    scales = n.inputs[1];
  } else {
    l.refuse(n, "it has neither a 'scales' attribute nor a scales input");
  }
  std::string mode = n.attr_string("mode", "nearest");
  if (mode == "bilinear") mode = "linear";
  if (mode != "nearest" && mode != "linear") l.refuse(n, "mode '" + mode + "' has no Resize equivalent");
  n.op_type = "Resize";
  n.attributes = {{"mode", Attribute::of_string(mode)}};
  n.inputs = {n.inputs.at(0), scales};
  l.note(n, "Upsample -> Resize");
}

// Resize-10 sampled with asymmetric coordinates (and, for nearest, rounded down); Resize-11 made
// both attributes with other defaults and put roi before scales.
void lift_resize_11(Lifter& l, Node& n) {
  if (n.inputs.size() < 2 || n.inputs.size() > 2) l.refuse(n, "Resize-10 takes exactly 2 inputs (X, scales)");
  const std::string roi =
      l.target() >= 13 ? std::string() : l.constant(n, "roi", at::empty({0}, at::kFloat));  // roi is optional from 13
  n.inputs = {n.inputs[0], roi, n.inputs[1]};
  n.attributes["coordinate_transformation_mode"] = Attribute::of_string("asymmetric");
  if (n.attr_string("mode", "nearest") == "nearest") n.attributes["nearest_mode"] = Attribute::of_string("floor");
  l.note(n, "inputs (X, scales) -> (X, roi, scales), asymmetric coordinates made explicit");
}

void lift_scatter(Lifter& l, Node& n) {
  n.op_type = "ScatterElements";
  l.note(n, "Scatter -> ScatterElements");
}

void lift_batchnorm_9(Lifter& l, Node& n) {
  if (!n.has_attr("spatial")) return;
  if (n.attr_int("spatial", 1) == 0 && l.rank(n.inputs.at(0)) != 2)
    l.refuse(n, "spatial = 0 (statistics per element, not per channel) has no equivalent in later opsets");
  n.attributes.erase("spatial");
  l.note(n, "'spatial' attribute removed");
}

void drop_training_outputs(Lifter& l, Node& n, std::size_t keep, const std::string& why) {
  for (std::size_t k = keep; k < n.outputs.size(); ++k)
    if (l.read_elsewhere(n.outputs[k])) l.refuse(n, "its output '" + n.outputs[k] + "' " + why + " and is read");
  if (n.outputs.size() > keep) {
    n.outputs.resize(keep);
    l.note(n, "unused training outputs removed");
  }
}

void lift_batchnorm_14(Lifter& l, Node& n) {
  drop_training_outputs(l, n, 1, "exists in training mode only from opset 14");
}

void lift_dropout_10(Lifter& l, Node& n) {
  drop_training_outputs(l, n, 1, "(the mask) changes type from the data's to bool at opset 10");
}

void lift_dropout_12(Lifter& l, Node& n) {
  if (!n.has_attr("ratio")) return;
  n.attributes.erase("ratio");  // an inference-mode Dropout is the identity, whatever the ratio
  l.note(n, "'ratio' attribute removed (inference mode)");
}

// Opset 18 normalized with scale and bias per group, 21 per channel: each group's value is
// repeated over its channels.
void lift_groupnorm_21(Lifter& l, Node& n) {
  const std::int64_t groups = n.attr_int("num_groups", 0);
  const ValueFact* x = l.fact(n.inputs.at(0));
  const std::int64_t channels = x && x->dims.size() >= 2 ? x->dims[1] : -1;
  if (channels <= 0 || groups <= 0 || channels % groups) l.refuse(n, "the number of channels of its input is unknown");
  Graph& g = l.graph();
  for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {
    auto it = g.initializers.find(n.inputs.at(i));
    if (it == g.initializers.end())
      l.refuse(n, "its scale and bias are computed, not initializers; they must be expanded from groups to channels");
    if (it->second.numel() != groups)
      l.refuse(n, "its scale/bias has " + std::to_string(it->second.numel()) + " values for " + std::to_string(groups) +
                      " groups");
    n.inputs[i] = l.constant(n, i == 1 ? "scale_per_channel" : "bias_per_channel",
                             it->second.reshape({-1}).repeat_interleave(channels / groups));
  }
  l.note(n, "scale and bias per group -> per channel");
}

void lift_roialign_16(Lifter& l, Node& n) {
  if (n.has_attr("coordinate_transformation_mode")) return;
  n.attributes["coordinate_transformation_mode"] = Attribute::of_string("output_half_pixel");  // the old behaviour
  l.note(n, "coordinate_transformation_mode = output_half_pixel made explicit");
}

void lift_gridsample_20(Lifter& l, Node& n) {
  const std::string mode = n.attr_string("mode", "bilinear");
  n.attributes["mode"] = Attribute::of_string(mode == "bilinear" ? "linear" : mode == "bicubic" ? "cubic" : mode);
  l.note(n, "mode '" + mode + "' renamed");
}

const std::map<std::string, std::vector<Step>>& rules() {
  static const std::map<std::string, std::vector<Step>> table = [] {
    std::map<std::string, std::vector<Step>> t;
    for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"}) t[op] = {{13, lift_softmax}};
    t["Split"] = {{13, lift_split_13}, {18, lift_split_18}};
    t["Squeeze"] = {{13, lift_axes}};
    t["Unsqueeze"] = {{13, lift_axes}};
    t["ReduceSum"] = {{13, lift_axes}};
    for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                           "ReduceLogSumExp", "ReduceSumSquare"})
      t[op] = {{18, lift_axes}};
    t["Clip"] = {{11, lift_clip}};
    t["Pad"] = {{11, lift_pad}};
    t["Slice"] = {{10, lift_slice}};
    t["TopK"] = {{10, lift_topk}};
    t["Upsample"] = {{10, lift_upsample}};
    t["Resize"] = {{11, lift_resize_11}};
    t["Scatter"] = {{11, lift_scatter}};
    t["BatchNormalization"] = {{9, lift_batchnorm_9}, {14, lift_batchnorm_14}};
    t["Dropout"] = {{10, lift_dropout_10}, {12, lift_dropout_12}};
    t["GroupNormalization"] = {{21, lift_groupnorm_21}};
    t["RoiAlign"] = {{16, lift_roialign_16}};
    t["GridSample"] = {{20, lift_gridsample_20}};
    return t;
  }();
  return table;
}

void lift_node(Lifter& l, Node& n, std::int64_t from) {
  for (const auto& a : n.attributes)
    if (a.second.kind == Attribute::Kind::kOpaque)
      l.refuse(n, "attribute '" + a.first + "' holds a list of subgraphs or another kind the lifter cannot rewrite");
  // If and Loop kept their meaning from opset 1 and 11; their bodies are lifted by lift_graph().
  if (n.op_type == "If" || n.op_type == "Loop") return;
  if (n.op_type == "Scan") {  // Scan-8 is rewritten by lift_graph() once its body is lifted
    if (from < 9 && n.has_input(0))
      l.refuse(n,
               "Scan-8 with sequence_lens (sequences of several lengths in one batch) has no Scan-9 form; "
               "re-export at opset 9 or newer");
    return;
  }
  // Upsample was deprecated at 10: one found in a newer model is still read as Upsample-9.
  std::int64_t version = n.op_type == "Upsample" ? std::min<std::int64_t>(from, 9) : from;
  for (;;) {
    auto it = rules().find(n.op_type);
    if (it == rules().end()) {
      if (kUnchanged.count(n.op_type)) return;
      l.refuse(n, "Sparsebit has no lifting rule for " + n.op_type + "; re-export the model at opset " +
                      std::to_string(l.target()) + " or newer");
    }
    const Step* next = nullptr;
    for (const auto& s : it->second)
      if (s.version > version && s.version <= l.target()) {
        next = &s;
        break;
      }
    if (!next) return;
    next->apply(l, n);  // may rename the op (Upsample -> Resize): the new op's rules continue from here
    version = next->version;
  }
}

std::string describe_sample(const std::vector<at::Tensor>& sample) {
  std::string s;
  for (const auto& t : sample) s += (s.empty() ? "" : ", ") + c10::str(t.sizes());
  return s;
}

}  // namespace

/// Lifts the default-domain nodes of `g` and, in the same way, of every subgraph in it. Names
/// are unique across nesting levels, so facts about enclosing values hold inside bodies; values
/// computed inside a body have none, and rules fall back to what needs no facts or refuse.
// Scan-8 runs its body over axis 1 of every scan input, for each batch entry (axis 0) apart;
// Scan-9 has no batch axis. So Scan-8 (without sequence_lens) becomes a Loop over the batch whose
// body takes entry i of every state and scan input (Gather on axis 0) and runs a Scan-9 over
// them with the original body; the Loop stacks the final states and the scan outputs of all
// entries along axis 0, which is Scan-8's layout. Called once the original body is lifted.
void scan8_to_loop(Lifter& l, Node& n) {
  Graph& g = l.graph();
  const std::int64_t m = n.attr_int("num_scan_inputs", 0);
  const std::size_t states = n.inputs.size() - 1 - static_cast<std::size_t>(m);
  if (m < 1 || n.inputs.size() < 1 + static_cast<std::size_t>(m)) l.refuse(n, "num_scan_inputs is out of range");
  std::shared_ptr<Graph> original = n.attributes.at("body").graph;
  auto node = [](const std::string& name, const char* op, std::vector<std::string> in, std::vector<std::string> out) {
    Node x;
    x.name = name;
    x.op_type = op;
    x.inputs = std::move(in);
    x.outputs = std::move(out);
    return x;
  };
  // The batch size: dim 0 of the first scan input.
  const std::string shape = g.unique_name(n.name + "_input_shape"), batch = g.unique_name(n.name + "_batch");
  g.insert_before(&n, node(g.unique_name(n.name + "_Shape"), "Shape", {n.inputs[1 + states]}, {shape}));
  Node first = node(g.unique_name(n.name + "_Gather"), "Gather",
                    {shape, l.constant(n, "zero", at::scalar_tensor(0, at::kLong))}, {batch});
  g.insert_before(&n, std::move(first));

  Graph body;
  body.opset_imports = g.opset_imports;
  body.opset_imports[""] = l.target();
  const std::string iter = g.unique_name(n.name + "_entry"), cond_in = g.unique_name(n.name + "_cond_in"),
                    cond_out = g.unique_name(n.name + "_cond_out");
  body.inputs = {{iter, 7, true, {}, ""}, {cond_in, 9, true, {}, ""}};
  body.outputs = {{cond_out, 9, true, {}, ""}};
  body.append(node(g.unique_name(n.name + "_keep_going"), "Identity", {cond_in}, {cond_out}));
  Node scan = node(g.unique_name(n.name + "_per_entry"), "Scan", {}, {});
  for (std::size_t j = 1; j < n.inputs.size(); ++j) {  // entry i of every state and scan input
    const std::string entry = g.unique_name(n.inputs[j] + "_entry");
    body.append(node(g.unique_name(n.name + "_take_" + std::to_string(j)), "Gather", {n.inputs[j], iter}, {entry}));
    scan.inputs.push_back(entry);
  }
  for (std::size_t k = 0; k < original->outputs.size(); ++k) {
    const std::string out = g.unique_name(n.outputs.at(k) + "_entry");
    scan.outputs.push_back(out);
    body.outputs.push_back({out, original->outputs[k].elem_type, false, {}, ""});
  }
  scan.attributes["num_scan_inputs"] = Attribute::of_int(m);
  if (n.has_attr("directions")) scan.attributes["scan_input_directions"] = n.attributes.at("directions");
  scan.attributes["body"].kind = Attribute::Kind::kGraph;
  scan.attributes["body"].graph = original;
  body.append(std::move(scan));

  n.op_type = "Loop";
  n.inputs = {batch, ""};
  n.attributes.clear();
  n.attributes["body"] = Attribute::of_graph(std::move(body));
  l.note(n, "Scan-8 -> Loop over the batch of a Scan-9 (" + std::to_string(states) + " states, " + std::to_string(m) +
                " scan inputs)");
}

void lift_graph(Graph& g, const ValueFacts& facts, std::int64_t target, LiftReport& report, std::int64_t from) {
  Lifter l(g, facts, target, report);
  for (Node* n : g.nodes()) {
    if (!n->domain.empty()) continue;
    lift_node(l, *n, from);
    for (auto& kv : n->attributes) {
      if (kv.second.kind != Attribute::Kind::kGraph || !kv.second.graph) continue;
      lift_graph(*kv.second.graph, facts, target, report, from);
      kv.second.graph->topological_sort();
    }
    if (n->op_type == "Scan" && from < 9) scan8_to_loop(l, *n);
  }
  g.opset_imports[""] = target;
}

LiftReport lift_opset(Graph& graph, std::int64_t target, const ValueFacts& facts) {
  LiftReport report;
  report.from = graph.default_opset();
  report.to = std::max(report.from, target);
  if (report.from >= target) return report;
  if (report.from < kMinLiftableOpset)
    throw Error("opset " + std::to_string(report.from) + " is older than the lifting rules start (" +
                std::to_string(kMinLiftableOpset) + ")");
  Graph lifted = graph.clone();  // all or nothing: the caller's graph changes only on success
  lift_graph(lifted, facts, target, report, report.from);
  lifted.topological_sort();
  lifted.validate();
  graph = std::move(lifted);
  return report;
}

LiftReport lift_model(Model& model, std::int64_t target, const Registry& registry,
                      const std::vector<at::Tensor>& sample) {
  const std::int64_t from = model.graph.default_opset();
  if (from >= target) return LiftReport{from, from, {}, false, 0};
  ValueFacts facts = static_value_facts(model.graph, model.meta.value_info);
  std::vector<at::Tensor> before;
  if (!sample.empty()) {
    ValueFacts observed;
    before = run_sample(model.graph, registry, sample, &observed);
    for (auto& [name, f] : observed) facts[name] = f;
  }
  Graph lifted = model.graph.clone();
  LiftReport report;
  try {
    report = lift_opset(lifted, target, facts);
  } catch (const Error& e) {
    throw Error(model.meta.source_path + ": " + e.what());
  }
  if (!sample.empty()) {
    const auto after = run_sample(lifted, registry, sample, nullptr);
    for (std::size_t i = 0; i < before.size(); ++i) {
      const at::Tensor& a = before[i];
      const at::Tensor& b = after.at(i);
      bool same = a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type();
      double diff = 0;
      if (same && a.is_floating_point()) {
        const at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
        diff = d.numel() ? d.max().item<double>() : 0;
        const double scale = a.numel() ? a.abs().max().item<double>() : 0;
        same = !std::isnan(diff) && diff <= 1e-5 * (1 + scale);  // reassociated reductions only
      } else if (same) {
        same = at::equal(a, b);
      }
      report.max_abs_diff = std::max(report.max_abs_diff, diff);
      if (!same) {
        throw Error(model.meta.source_path + ": lifting from opset " + std::to_string(from) + " to " +
                    std::to_string(target) + " changed graph output '" + lifted.outputs[i].name +
                    "' on a sample of shape " + describe_sample(sample) + " (max |difference| " + c10::str(diff) +
                    "); re-export the model at opset " + std::to_string(target) + " and report this model");
      }
    }
    report.checked = true;
  }
  model.graph = std::move(lifted);
  return report;
}

namespace {

/// The model's typed inputs and outputs without a shape, each with "input" or "output".
std::vector<std::pair<const char*, ValueInfo*>> shapeless_io(Graph& g) {
  std::vector<std::pair<const char*, ValueInfo*>> out;
  for (auto& v : g.inputs)
    if (v.elem_type != 0 && !v.has_shape) out.emplace_back("input", &v);
  for (auto& v : g.outputs)
    if (v.elem_type != 0 && !v.has_shape) out.emplace_back("output", &v);
  return out;
}

// Note [Inputs and outputs without a shape]
// Some exporters declare a model input or output with its element type alone. ONNX Runtime
// reads such a model, but ONNX's checker requires a shape on every input and output of the
// main graph (its dims may be unknown), so the export would be refused after all the work.
// The rank is taken from one sample of the calibration data; the dims are written unknown,
// since one sample cannot say which of them vary.
void give_io_ranks(Model& model, const Registry& registry, const std::vector<at::Tensor>& sample,
                   const std::string& path) {
  const auto shapeless = shapeless_io(model.graph);
  if (shapeless.empty()) return;
  if (sample.empty())
    throw Error(path + ": " + shapeless[0].first + " '" + printable(shapeless[0].second->name) +
                "' declares its element type but no shape, which ONNX's checker requires of a model's inputs and "
                "outputs: declare its shape in the model (dims may be symbolic), or give calibration data, from "
                "which its rank is taken");
  const std::vector<at::Tensor> outputs = detail::run_sample(model.graph, registry, sample, nullptr);
  auto set_rank = [&](ValueInfo& v, const at::Tensor& t, const char* what) {
    if (v.elem_type == 0 || v.has_shape || !t.defined()) return;
    v.has_shape = true;
    v.shape.assign(static_cast<std::size_t>(t.dim()), Dim{});
    sdk::log_info(path + ": " + what + " '" + v.name + "' declares no shape; written with rank " +
                  std::to_string(t.dim()) + " (dims unknown), as one sample has it");
  };
  for (std::size_t i = 0; i < model.graph.inputs.size() && i < sample.size(); ++i)
    set_rank(model.graph.inputs[i], sample[i], "input");
  for (std::size_t i = 0; i < model.graph.outputs.size() && i < outputs.size(); ++i)
    set_rank(model.graph.outputs[i], outputs[i], "output");
}

}  // namespace

Model load_and_lift(const std::string& path, const Registry& registry, const DataSource& calib, std::int64_t target) {
  Model model = load_onnx(path, ImportOptions{0});
  const bool lift = model.graph.default_opset() < target;
  if (!lift && shapeless_io(model.graph).empty()) return model;
  Executor check(model.graph, registry);  // an op without a QModule is named before the data is read
  const std::vector<at::Tensor> sample = calib.empty() ? std::vector<at::Tensor>{} : sample_inputs(model.graph, calib);
  give_io_ranks(model, registry, sample, path);
  if (!lift) return model;
  const LiftReport r = lift_model(model, target, registry, sample);
  sdk::log_info(path + ": lifted from opset " + std::to_string(r.from) + " to " + std::to_string(r.to) + " (" +
                std::to_string(r.rewrites.size()) + " node rewrites" +
                (r.checked ? ", outputs checked on one sample: max |difference| " + c10::str(r.max_abs_diff)
                           : std::string(", not checked: no calibration data")) +
                ")");
  for (const auto& line : r.rewrites) sdk::log_debug("  " + line);
  return model;
}

}  // namespace sparsebit
