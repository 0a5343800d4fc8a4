// disable_unnecessary_quant: in chains that deployment runs as one fused kernel, quantize only
// the chain's input.
//
// A chain starts at Conv, ConvTranspose, Gemm, MatMul, BatchNormalization or Add and continues
// through single-reader edges into BatchNormalization (after a conv/linear head) and element-wise
// activations. ONNX Runtime and TensorRT compute such a chain in one kernel and round once, at
// its end; a Q/DQ pair inside it would make the simulation round twice (and ONNX Runtime's
// optimizer removes such pairs, so the exported model would disagree with the simulation).
//
// float_norms_and_heads: no quantizer inside normalization chains or in front of a model's
// final Softmax / LogSoftmax / Sigmoid. A normalization is LayerNormalization (or Instance- or
// GroupNormalization), or its decomposed form as exporters before opset 17 write it: ReduceMean
// -> Sub -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div [-> Mul(gamma) -> Add(beta)]. Its
// variance and reciprocal have a skewed, wide range an 8-bit grid describes badly, and neither
// ONNX Runtime nor TensorRT runs those ops in integers; the head's input (the logits) would only
// be rounded before a float op whose output leaves the model. Nor in front of a data-movement op
// (Identity, Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Concat, Slice, Gather, Expand,
// Tile) whose output leaves the model or its control-flow body: nothing reads that value as
// integers, and the rounding would reach the caller untouched; a recurrent state returned that
// way (a streaming detector's LSTM states, joined by a Concat and fed back by the application)
// would carry it from call to call, and an 8-bit grid wide enough for a cell state is coarse. Nor on squares and their
// sums (Pow(x, 2), Mul(x, x), an Add of those: a power spectrum, an energy) wherever they are read: an 8-bit grid
// spaced for the largest square rounds the small ones, whose relative spread is twice the signal's in decibels, to
// zero. Bodies of If/Loop/Scan are searched like the main graph.
//
// float_attention_scores: no quantizer on an attention's scores, from the MatMul of queries and
// keys through its scale (Mul / Div by a constant), additive biases and masks (Add, Where) and
// shape ops (Reshape, Unsqueeze, Squeeze) to the Softmax's input. The MatMul's inputs and the
// Softmax's output stay quantized. TensorRT's fused attention keeps the scores in higher
// precision and quantizes the probabilities; ONNX Runtime runs DQ -> MatMul -> Softmax -> Q with
// a float MatMul output. The scores span a wide, model-dependent range that 8 bits serve badly,
// right before the exponential that magnifies their rounding.

#include <algorithm>
#include <map>
#include <set>

#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

const std::set<std::string> kHeads = {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "Add"};
// Ops that only move or select values: what they read leaves as it came in.
const std::set<std::string> kMoves = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose",
                                      "Concat",   "Slice",   "Gather",  "Expand",    "Tile"};
const std::set<std::string> kActivations = {"Relu",        "Clip",      "LeakyRelu", "PRelu", "Sigmoid",
                                            "HardSigmoid", "HardSwish", "Tanh",      "Elu",   "Selu",
                                            "Mish",        "Softplus",  "Gelu"};

class DisableUnnecessaryQuant final : public Pass {
 public:
  Stage stage() const override { return Stage::kFuse; }

  bool run_quant(QuantState& state, const PassContext&) override { return run_on(state, state.graph()); }

 private:
  /// The graph's chains, then those of its control-flow bodies.
  static bool run_on(QuantState& state, const Graph& g) {
    bool changed = false;
    for (const Node* n : g.nodes())
      for (const Graph* body : n->subgraphs()) changed = run_on(state, *body) || changed;
    // Readers of every tensor, to follow single-reader edges.
    std::map<std::string, std::vector<const Node*>> readers;
    for (const Node* n : g.nodes())
      for (const auto& in : n->inputs)
        if (!in.empty()) readers[in].push_back(n);
    for (const Node* head : g.nodes()) {
      if (!head->domain.empty() || !kHeads.count(head->op_type) || head->outputs.empty()) continue;
      const bool linear_head = head->op_type != "Add" && head->op_type != "BatchNormalization";
      const Node* cur = head;
      while (true) {
        const std::string& out = cur->outputs[0];
        auto it = readers.find(out);
        if (it == readers.end() || it->second.size() != 1 || g.is_graph_output(out)) break;
        const Node* next = it->second[0];
        if (!next->domain.empty()) break;
        const bool bn = next->op_type == "BatchNormalization" && linear_head && cur == head;
        if (!bn && !kActivations.count(next->op_type)) break;
        if (next->inputs.empty() || next->inputs[0] != out) break;
        if (state.is_quantized(*next, 0)) {
          state.set_fake_fused(*next, 0, true);
          changed = true;
        }
        if (next->outputs.empty()) break;
        cur = next;
      }
    }
    return changed;
  }
};

class FloatNormsAndHeads final : public Pass {
 public:
  Stage stage() const override { return Stage::kFuse; }

  bool run_quant(QuantState& state, const PassContext&) override {
    std::set<const Node*> unquantized;
    std::set<std::pair<const Node*, std::size_t>> inputs;
    collect(state.graph(), unquantized, inputs);
    for (const Node* n : unquantized)
      for (std::size_t i = 0; i < n->inputs.size(); ++i) inputs.insert({n, i});
    bool changed = false;
    for (const auto& [n, i] : inputs)
      if (state.is_quantized(*n, i)) {
        state.set_fake_fused(*n, i, true);
        changed = true;
      }
    return changed;
  }

 private:
  static void collect(const Graph& g, std::set<const Node*>& unquantized,
                      std::set<std::pair<const Node*, std::size_t>>& inputs) {
    const std::set<std::string> leaving = values_leaving(g);
    for (const Node* n : g.nodes()) {
      for (const Graph* body : n->subgraphs()) collect(*body, unquantized, inputs);
      if (n->domain.empty() && !n->outputs.empty() && is_square_or_sum(g, *n))
        for (const auto& [reader, k] : g.consumers(n->outputs[0])) inputs.insert({reader, k});
      if (!n->domain.empty()) continue;
      if (n->op_type == "LayerNormalization" || n->op_type == "InstanceNormalization" ||
          n->op_type == "GroupNormalization")
        unquantized.insert(n);
      const bool leaves = !n->outputs.empty() && leaving.count(n->outputs[0]);
      if ((n->op_type == "Softmax" || n->op_type == "LogSoftmax" || n->op_type == "Sigmoid") && leaves)
        unquantized.insert(n);
      if (kMoves.count(n->op_type) && leaves) unquantized.insert(n);
      if (n->op_type == "Div") add_decomposed_norm(g, *n, unquantized);
    }
  }

  /// Values that leave the graph (or body) as they are: outputs, and values read only by
  /// data-movement ops whose results leave (the Identity an exporter puts before a body's output).
  static std::set<std::string> values_leaving(const Graph& g) {
    std::map<std::string, std::vector<const Node*>> readers;
    for (const Node* n : g.nodes())
      for (const auto& in : n->inputs)
        if (!in.empty()) readers[in].push_back(n);
    std::set<std::string> leaving;
    for (const auto& o : g.outputs) leaving.insert(o.name);
    const auto nodes = g.nodes();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {  // readers come later in the order
      for (const auto& out : (*it)->outputs) {
        auto r = readers.find(out);
        if (out.empty() || leaving.count(out) || r == readers.end()) continue;
        const bool passed_on = std::all_of(r->second.begin(), r->second.end(), [&](const Node* reader) {
          return reader->domain.empty() && kMoves.count(reader->op_type) && reader->inputs[0] == out &&
                 !reader->outputs.empty() && leaving.count(reader->outputs[0]);
        });
        if (passed_on) leaving.insert(out);
      }
    }
    return leaving;
  }

  /// Pow(x, 2), Mul(x, x), or an Add whose inputs are all such.
  static bool is_square_or_sum(const Graph& g, const Node& n) {
    if (n.op_type == "Mul") return n.inputs.size() == 2 && n.inputs[0] == n.inputs[1];
    if (n.op_type == "Pow") {
      if (n.inputs.size() != 2 || !g.initializers.count(n.inputs[1])) return false;
      const at::Tensor& e = g.initializers.at(n.inputs[1]);
      return e.numel() == 1 && e.to(at::kDouble).item<double>() == 2.0;
    }
    if (n.op_type != "Add" || n.inputs.size() != 2) return false;
    for (const auto& in : n.inputs) {
      const Node* p = g.producer(in);
      if (!p || !p->domain.empty() || p->op_type == "Add" || !is_square_or_sum(g, *p)) return false;
    }
    return true;
  }

  static const Node* made_by(const Graph& g, const std::string& value, const char* op) {
    const Node* p = g.producer(value);
    return p && p->domain.empty() && p->op_type == op ? p : nullptr;
  }
  static bool has_constant(const Graph& g, const Node& n) {
    for (const auto& in : n.inputs)
      if (g.initializers.count(in)) return true;
    return false;
  }
  static const Node* only_reader(const Graph& g, const Node& n, const char* op) {
    const auto readers = g.consumers(n.outputs[0]);
    if (readers.size() != 1 || g.is_graph_output(n.outputs[0])) return nullptr;
    const Node* r = readers[0].first;
    return r->domain.empty() && r->op_type == op ? r : nullptr;
  }

  /// Div(Sub(x, ReduceMean(x)), Sqrt(Add(ReduceMean(Pow(Sub)), eps))) and its affine tail.
  static void add_decomposed_norm(const Graph& g, const Node& div, std::set<const Node*>& out) {
    if (div.inputs.size() != 2) return;
    const Node* sub = made_by(g, div.inputs[0], "Sub");
    const Node* sqrt = made_by(g, div.inputs[1], "Sqrt");
    if (!sub || !sqrt) return;
    const Node* eps = made_by(g, sqrt->inputs[0], "Add");
    if (!eps || eps->inputs.size() != 2) return;
    const Node* var = made_by(g, eps->inputs[0], "ReduceMean");
    if (!var) var = made_by(g, eps->inputs[1], "ReduceMean");
    if (!var) return;
    const Node* square = made_by(g, var->inputs[0], "Pow");
    if (!square) square = made_by(g, var->inputs[0], "Mul");
    if (!square || square->inputs[0] != sub->outputs[0]) return;
    const Node* mean = made_by(g, sub->inputs[1], "ReduceMean");
    if (!mean || mean->inputs[0] != sub->inputs[0]) return;
    out.insert({mean, sub, square, var, eps, sqrt, &div});
    if (const Node* gamma = only_reader(g, div, "Mul"); gamma && has_constant(g, *gamma)) {
      out.insert(gamma);
      if (const Node* beta = only_reader(g, *gamma, "Add"); beta && has_constant(g, *beta)) out.insert(beta);
    }
  }
};

class FloatAttentionScores final : public Pass {
 public:
  Stage stage() const override { return Stage::kFuse; }

  bool run_quant(QuantState& state, const PassContext&) override {
    const Graph& g = state.graph();
    bool changed = false;
    for (const Node* softmax : g.nodes()) {
      if (!softmax->domain.empty() || softmax->op_type != "Softmax" || softmax->inputs.empty()) continue;
      std::vector<std::pair<const Node*, std::size_t>> chain{{softmax, 0}};  // (reader, input) of the scores
      if (!scores_chain(g, softmax->inputs[0], chain)) continue;
      for (const auto& [node, input] : chain)
        if (state.is_quantized(*node, input)) {
          state.set_fake_fused(*node, input, true);
          changed = true;
        }
    }
    return changed;
  }

 private:
  /// Walks from `value` back to the MatMul that makes it, through the ops attention puts between
  /// the scores and the Softmax, recording each (node, input) that reads the scores on the way.
  static bool scores_chain(const Graph& g, const std::string& value,
                           std::vector<std::pair<const Node*, std::size_t>>& chain, int depth = 0) {
    const Node* p = g.producer(value);
    if (!p || !p->domain.empty() || p->inputs.empty() || depth > 8) return false;
    if (p->op_type == "MatMul") return true;
    std::vector<std::size_t> operands;  // which inputs may carry the scores
    if (p->op_type == "Mul" || p->op_type == "Add") operands = {0, 1};
    else if (p->op_type == "Div") operands = {0};
    else if (p->op_type == "Where") operands = {2, 1};
    else if (p->op_type == "Reshape" || p->op_type == "Unsqueeze" || p->op_type == "Squeeze") operands = {0};
    for (std::size_t i : operands) {
      if (i >= p->inputs.size() || g.initializers.count(p->inputs[i])) continue;
      const std::size_t mark = chain.size();
      chain.emplace_back(p, i);
      if (scores_chain(g, p->inputs[i], chain, depth + 1)) return true;
      chain.resize(mark);
    }
    return false;
  }
};

void register_all(Registrar& r) {
  r.add_pass<DisableUnnecessaryQuant>("disable_unnecessary_quant", PassSchedule{1700, true});
  r.add_pass<FloatNormsAndHeads>("float_norms_and_heads", PassSchedule{1800, true});
  r.add_pass<FloatAttentionScores>("float_attention_scores", PassSchedule{1900, false});
}

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.disable_unnecessary_quant", SPARSEBIT_PLUGIN_VERSION,
                 sparsebit::passes::register_all)
