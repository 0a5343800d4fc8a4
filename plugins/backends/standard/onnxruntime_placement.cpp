// Note [ONNX Runtime placement]
// ONNX Runtime (CPU provider) turns Q/DQ into integer kernels node by node, where its QDQ
// selectors accept the node's neighbourhood (onnxruntime/core/optimizer/qdq_transformer/
// selectors_actions/qdq_selector_action_transformer.cc lists the rules, qdq_selectors.cc checks
// them):
//   - Conv (QLinearConv), Add and Mul (QLinearAdd/Mul), Concat (QLinearConcat), AveragePool,
//     GlobalAveragePool, LeakyRelu, Sigmoid and Softmax (their QLinear forms): every input that
//     exists comes from a DequantizeLinear (a Conv's bias too, as int32), the output goes to
//     QuantizeLinear nodes only, one per output, and is no graph output
//     (NodeGroupSelector::CheckQDQNodes);
//   - MatMul and Gemm alike, or with no QuantizeLinear at all: MatMulIntegerToFloat and QGemm
//     then write float;
//   - a Relu or a Clip between the op and its QuantizeLinear is dropped when the Q's range lies
//     inside the clip's (GetQDQSelection's redundant clip): an unsigned grid, whose zero point is
//     0 after a Relu or a Clip with lower bound 0;
//   - data movement (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Slice, Gather, Expand,
//     Tile, MaxPool, Resize, Split) runs on the 8-bit data between a DQ and a Q of one grid.
// Anything else runs in float: a float op reading a quantized tensor costs a DequantizeLinear
// pass, a quantized tensor made by a float op a QuantizeLinear pass. A quantized op whose output
// also reaches a float op directly (PP-OCR's HardSwish, written out as Add, Clip, Div and Mul,
// reads the convolution's output twice) runs in float behind its DequantizeLinear nodes: slower
// than the float model, which fuses the activation into the convolution.
//
// The placement, on the main graph (control-flow bodies keep the ops' roles):
//   1. Candidates: ops of the first two kinds whose inputs the ops' roles quantize, that can
//      end in a Q.
//   2. Each candidate costs, with its neighbours as they stand: as an integer kernel, a Q pass
//      over each input that a float op makes (shared by the integer ops reading it) and a DQ pass
//      for each float reader of its output, less the multiply-adds it saves (saved_per_mac of a
//      pass each: a Conv saves K per output element, K = C_in / groups x kernel area); in
//      float, a DQ pass over each input an integer op makes and a Q pass over its output where
//      integer ops read it. Sizes are the elements per sample the float model computes on the
//      first calibration sample (QuantState::value_elements), else those of a unit output.
//      Candidates that cost more as integer kernels go to float, one at a time in graph order,
//      until none does.
//   3. Every reader of an integer op's output (past a dropped clip) reads it through one Q/DQ
//      (with Note [One grid per tensor], one grid for all of them); other activation quantizers
//      go, and so do the weights of layers left float (ONNX Runtime does not fold a
//      DequantizeLinear of a weight: it would run on every inference).
//   4. The readers of a data movement op (MaxPool, Reshape, Transpose, Resize, ...) whose input
//      is quantized share one grid with that input (QuantState::tie_grid; the readers', chosen
//      for the layers that read it): ONNX Runtime drops a DQ/Q pair around such an op only when
//      the two grids are one (DropQDQNodesRules, IsQDQPairSupported). Exact where the op only
//      moves data (rounding onto one grid commutes with it); Resize's interpolation rounds onto
//      the same grid either way.
// saved_per_mac = 1/28 was measured with ONNX Runtime 1.30 on this project's 2-core machines
// (bench/placement_cost.sh; bench/RESULTS.md, "Placement cost"): chains of 1x1 convolutions as
// QLinearConv against float, and Q/DQ pairs around a float op, 1/25 to 1/49 with 128 to 32
// channels on a processor with VNNI. The latency step then times what the export does, on the
// machine it runs on (Note [Latency step]).

#include "onnxruntime_placement.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace sparsebit::backends {
namespace {

const std::set<std::string> kMatrixOps = {"Conv", "MatMul", "Gemm"};
const std::set<std::string> kFloatOutputOps = {"MatMul", "Gemm"};
const std::set<std::string> kQLinearOps = {"Add",       "Mul",     "Concat", "AveragePool", "GlobalAveragePool",
                                           "LeakyRelu", "Sigmoid", "Softmax"};
const std::set<std::string> kOnIntegers = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice",
                                           "Gather",  "Expand",    "Tile",    "MaxPool",   "Resize",  "Split"};
// What ONNX Runtime's DropQDQNodesRules (and SplitQDQRules) run on the integers when the DQ
// before and the Q after share one grid.
const std::set<std::string> kDropsQdq = {"Reshape", "Transpose", "Squeeze",       "Unsqueeze", "Flatten",
                                         "Slice",   "Gather",    "Expand",        "Tile",      "MaxPool",
                                         "Resize",  "Split",     "GatherElements"};
// Layers that read their input in float (the backend keeps them so): an op feeding one stays float.
const std::set<std::string> kRecurrentOps = {"LSTM", "GRU", "RNN"};
// Multiply-adds per output element assumed where the weights are computed (attention's products).
constexpr double kUnknownDepth = 64;

bool is(const Node& n, const std::set<std::string>& ops) { return n.domain.empty() && ops.count(n.op_type) != 0; }

class Placement {
 public:
  Placement(QuantState& state, double saved_per_mac) : state_(state), g_(state.graph()), saved_(saved_per_mac) {
    for (const Node* n : g_.nodes()) {
      for (const auto& v : n->implicit_inputs()) leaving_.insert(v);
      for (std::size_t i = 0; i < n->inputs.size(); ++i)
        if (!n->inputs[i].empty()) consumers_[n->inputs[i]].emplace_back(n, i);
      for (const auto& o : n->outputs)
        if (!o.empty()) producer_[o] = n;
    }
    for (const auto& o : g_.outputs) leaving_.insert(o.name);
  }

  void run() {
    for (const Node* n : g_.nodes())
      if (candidate(*n)) integer_.insert(n);
    demote_costly();
    while (!quantize_outputs()) demote_costly();
    drop_unneeded();
    tie_data_movement();
  }

 private:
  bool constant(const std::string& v) const { return g_.initializers.count(v) != 0; }
  const Node* producer(const std::string& v) const {
    auto it = producer_.find(v);
    return it == producer_.end() ? nullptr : it->second;
  }
  const std::vector<std::pair<const Node*, std::size_t>>& consumers(const std::string& v) const {
    static const std::vector<std::pair<const Node*, std::size_t>> none;
    auto it = consumers_.find(v);
    return it == consumers_.end() ? none : it->second;
  }

  /// A Relu, or a Clip whose lower bound is 0.
  bool zero_floor_clip(const Node& n) const {
    if (!n.domain.empty()) return false;
    if (n.op_type == "Relu") return true;
    if (n.op_type != "Clip") return false;
    if (n.has_attr("min")) return n.attr_float("min", -1) == 0.0;  // before opset 11
    if (!n.has_input(1) || !constant(n.inputs[1])) return false;
    const at::Tensor& lo = g_.initializers.at(n.inputs[1]);
    return lo.numel() == 1 && lo.item<double>() == 0.0;
  }

  /// Whether `n`'s activations take an unsigned grid (zero point 0 above a Relu); without a
  /// spec to tell (a test's state), the [a] default of this backend's configs, affine.
  bool unsigned_grid(const Node& n) const {
    const QSpec* spec = state_.input_spec(n, 0);
    return !spec || !spec->symmetric;
  }

  /// The value `n`'s QuantizeLinear reads: its output, or the output of a zero-floor clip that
  /// is its only reader (ONNX Runtime drops the clip); `clip` is set to that clip.
  std::string out_value(const Node& n, const Node** clip = nullptr) const {
    const std::string& t = n.outputs[0];
    const auto& readers = consumers(t);
    if (readers.size() == 1 && readers[0].second == 0 && zero_floor_clip(*readers[0].first) && unsigned_grid(n) &&
        !leaves_graph(t) && !readers[0].first->outputs.empty()) {
      if (clip) *clip = readers[0].first;
      return readers[0].first->outputs[0];
    }
    return t;
  }

  /// A graph output, or read inside a control-flow body.
  bool leaves_graph(const std::string& v) const { return leaving_.count(v) != 0; }

  bool candidate(const Node& n) const {
    if (!is(n, kMatrixOps) && !is(n, kQLinearOps)) return false;
    std::size_t outputs = 0;
    for (const auto& o : n.outputs) outputs += !o.empty();
    if (outputs != 1 || n.outputs[0].empty()) return false;
    bool any_activation = false;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (!n.has_input(i)) continue;
      if (!state_.is_quantized(n, i)) return false;
      any_activation = any_activation || !constant(n.inputs[i]);
    }
    return any_activation && (is(n, kFloatOutputOps) || !leaves_graph(out_value(n)));
  }

  /// Whether `n` stays an integer kernel with a float output (MatMulIntegerToFloat, QGemm):
  /// a MatMul or Gemm that no integer op reads, or whose output leaves the graph.
  bool float_output(const Node& n) const {
    if (!is(n, kFloatOutputOps)) return false;
    const std::string out = out_value(n);
    return leaves_graph(out) || readers(out).integer == 0;
  }

  /// The integer op whose quantized output `value` is, through data movement and a dropped
  /// clip, or null.
  const Node* source(std::string value) const {
    for (std::size_t hops = 0; hops <= g_.num_nodes(); ++hops) {
      const Node* p = producer(value);
      if (!p || !p->domain.empty() || p->inputs.empty()) return nullptr;
      if (!integer_.count(p) && zero_floor_clip(*p)) {  // the clip ONNX Runtime drops after an integer op?
        p = producer(p->inputs[0]);
        if (!p || !integer_.count(p)) return nullptr;
      }
      if (integer_.count(p)) return !float_output(*p) && out_value(*p) == value ? p : nullptr;
      if (!is(*p, kOnIntegers)) return nullptr;
      value = p->inputs[0];
    }
    return nullptr;
  }

  struct Readers {
    std::size_t integer = 0, floating = 0;  // a graph output or a body's read counts as float
  };
  /// Readers of `value`, past data movement ops (which run on the 8-bit data).
  Readers readers(const std::string& value, std::size_t depth = 0) const {
    Readers r;
    if (leaves_graph(value)) ++r.floating;
    for (const auto& [reader, k] : consumers(value)) {
      if (integer_.count(reader)) {
        ++r.integer;
      } else if (is(*reader, kOnIntegers) && k == 0 && depth < 16) {
        for (const auto& o : reader->outputs) {
          if (o.empty()) continue;
          const Readers next = readers(o, depth + 1);
          r.integer += next.integer, r.floating += next.floating;
        }
      } else {
        ++r.floating;
      }
    }
    return r;
  }

  /// Elements per sample of `v`, or `fallback` (in units of the node's output) when unknown.
  double size(const std::string& v, double fallback) const {
    const std::int64_t n = state_.value_elements(v);
    return n >= 0 ? static_cast<double>(n) : fallback;
  }

  // Multiply-adds per output element of a matrix op.
  double depth(const Node& n) const {
    const bool has_weight = n.has_input(1) && constant(n.inputs[1]);
    if (!has_weight) return kUnknownDepth;
    const at::Tensor& w = g_.initializers.at(n.inputs[1]);
    if (n.op_type == "Conv")
      return w.dim() >= 1 && w.size(0) > 0 ? static_cast<double>(w.numel()) / static_cast<double>(w.size(0)) : 0;
    if (w.dim() < 2) return 0;
    if (n.op_type == "Gemm") return static_cast<double>(w.size(n.attr_int("transB", 0) ? 1 : 0));
    return static_cast<double>(w.size(-2));  // MatMul
  }

  /// Elements of input `t` per element of the output when sizes are unknown (a Conv's input
  /// channels and strides against its output channels).
  double input_ratio(const Node& n) const {
    if (n.op_type != "Conv" || !n.has_input(1) || !constant(n.inputs[1])) return 1;
    const at::Tensor& w = g_.initializers.at(n.inputs[1]);
    if (w.dim() < 2 || w.size(0) == 0) return 1;
    double stride = 1;
    for (std::int64_t s : n.attr_ints("strides", {})) stride *= static_cast<double>(s);
    const double groups = static_cast<double>(n.attr_int("group", 1));
    return static_cast<double>(w.size(1)) * groups * stride / static_cast<double>(w.size(0));
  }

  double cost_integer(const Node& n) const {
    const double out_size = size(n.outputs[0], 1);
    double cost = is(n, kMatrixOps) ? -saved_ * depth(n) * out_size : 0;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (!n.has_input(i) || constant(n.inputs[i]) || source(n.inputs[i])) continue;
      const Readers r = readers(n.inputs[i]);
      cost += size(n.inputs[i], input_ratio(n) * out_size) / static_cast<double>(std::max<std::size_t>(1, r.integer));
    }
    if (!float_output(n)) cost += static_cast<double>(readers(out_value(n)).floating) * out_size;
    return cost;
  }

  double cost_float(const Node& n) const {
    const double out_size = size(n.outputs[0], 1);
    double cost = 0;
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (n.has_input(i) && !constant(n.inputs[i]) && source(n.inputs[i]))
        cost += size(n.inputs[i], input_ratio(n) * out_size);
    if (readers(out_value(n)).integer > 0) cost += out_size;
    return cost;
  }

  void demote_costly() {
    for (bool changed = true; changed;) {
      changed = false;
      for (const Node* n : g_.nodes()) {
        if (integer_.count(n) && cost_integer(*n) > cost_float(*n)) {
          integer_.erase(n);
          changed = true;
        }
      }
    }
  }

  /// Step 3's first half: every reader of an integer op's output reads it through a Q/DQ.
  /// False (with the op demoted) where a reader cannot be quantized (a `skip` glob, a
  /// recurrent layer, a control-flow node).
  bool quantize_outputs() {
    for (const Node* n : g_.nodes()) {
      if (!integer_.count(n) || float_output(*n)) continue;
      const Node* clip = nullptr;
      const std::string out = out_value(*n, &clip);
      if (clip) state_.set_fake_fused(*clip, 0, true);
      for (const auto& [reader, k] : consumers(out)) {
        if (is(*reader, kRecurrentOps) || !reader->subgraphs().empty() || !state_.quantize_activation(*reader, k)) {
          integer_.erase(n);
          return false;
        }
      }
    }
    return true;
  }

  /// Step 3's second half: quantizers nothing needs go, and the weights of layers left float.
  void drop_unneeded() {
    for (const Node* n : g_.nodes()) {
      if (integer_.count(n) || !n->domain.empty() || !n->subgraphs().empty()) continue;
      for (std::size_t i = 0; i < n->inputs.size(); ++i) {
        if (!n->has_input(i) || !state_.is_quantized(*n, i)) continue;
        if (constant(n->inputs[i])) {
          if (!is(*n, kOnIntegers)) state_.set_fake_fused(*n, i, true);  // Gather's table is the user's choice
          continue;
        }
        const Node* s = source(n->inputs[i]);
        // A reader of an integer op's output keeps its DQ; so does data movement further on.
        if (!s || (out_value(*s) != n->inputs[i] && !is(*n, kOnIntegers))) state_.set_fake_fused(*n, i, true);
      }
    }
  }

  /// Step 4: the readers of a data movement op whose input is quantized share one grid with
  /// it, so that ONNX Runtime drops the DQ/Q pair around the op and runs it on the integers.
  void tie_data_movement() {
    const std::int64_t opset = g_.opset_imports.count("") ? g_.opset_imports.at("") : 0;
    for (const Node* n : g_.nodes()) {
      if (!is(*n, kDropsQdq) || !state_.is_quantized(*n, 0)) continue;
      if (n->op_type == "MaxPool" && (opset < 12 || (n->outputs.size() > 1 && !n->outputs[1].empty())))
        continue;  // MaxPool on 8 bits: opset 12 on, without indices
      for (const auto& o : n->outputs)
        for (const auto& [reader, k] : consumers(o))
          if (state_.is_quantized(*reader, k)) state_.tie_grid(*reader, k, *n, 0);
    }
  }

  QuantState& state_;
  const Graph& g_;
  double saved_;
  std::set<std::string> leaving_;  // graph outputs and values read inside bodies
  std::map<std::string, const Node*> producer_;
  std::map<std::string, std::vector<std::pair<const Node*, std::size_t>>> consumers_;
  std::set<const Node*> integer_;
};

}  // namespace

void place_for_onnxruntime(QuantState& state, double saved_per_mac) { Placement(state, saved_per_mac).run(); }

}  // namespace sparsebit::backends
