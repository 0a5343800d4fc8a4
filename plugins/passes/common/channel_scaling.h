#pragma once
// Per-channel rescaling of an activation X read by weighted layers, shared by the passes that
// move range between activations and weights (smooth_quant, awq): the readers' weight rows are
// multiplied by s, and X's channels divided by s, either in the op that produced X or in a Mul
// inserted in front of the readers, so the float function is unchanged.

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/sdk/graph.h"

namespace sparsebit::passes {

/// A reader of X whose weight rows (input channels, along `weight_axis`) can absorb s.
struct ScaledReader {
  Node* node;
  std::int64_t weight_axis;
};

inline bool float_constant(const Graph& g, const Node& n, std::size_t i) {
  return n.has_input(i) && g.initializers.count(n.inputs[i]) && g.initializers.at(n.inputs[i]).is_floating_point();
}

/// If `n` reads X (input 0) through a constant weight whose input-channel rows can absorb s: the
/// axis of X holding the channels (-1 for MatMul / Gemm, 1 for Conv) and the reader. Pointwise
/// (1x1) convolutions when `convs`, depthwise ones with multiplier 1 when also `depthwise`.
inline std::optional<std::pair<std::int64_t, ScaledReader>> scalable_reader(const Graph& g, Node& n, bool convs,
                                                                            bool depthwise) {
  if (!n.domain.empty() || !n.has_input(0) || g.initializers.count(n.inputs[0])) return std::nullopt;
  if (n.op_type == "MatMul" && float_constant(g, n, 1) && g.initializers.at(n.inputs[1]).dim() == 2)
    return std::make_pair(std::int64_t{-1}, ScaledReader{&n, 0});
  if (n.op_type == "Gemm" && float_constant(g, n, 1) && n.attr_int("transA", 0) == 0)
    return std::make_pair(std::int64_t{-1}, ScaledReader{&n, n.attr_int("transB", 0) ? 1 : 0});
  if (convs && n.op_type == "Conv" && float_constant(g, n, 1)) {
    const at::Tensor& w = g.initializers.at(n.inputs[1]);
    const std::int64_t group = n.attr_int("group", 1);
    if (group == 1) {
      bool pointwise = w.dim() >= 3;
      for (std::int64_t d = 2; d < w.dim(); ++d) pointwise = pointwise && w.size(d) == 1;
      if (pointwise) return std::make_pair(std::int64_t{1}, ScaledReader{&n, 1});
    } else if (depthwise && w.dim() >= 3 && w.size(1) == 1 && w.size(0) == group) {  // multiplier 1
      return std::make_pair(std::int64_t{1}, ScaledReader{&n, 0});
    }
  }
  return std::nullopt;
}

/// Points constant input `i` of `n` at `value` under a fresh name (others may share the old
/// one) and drops the old initializer once nothing reads it, so a model whose weights are all
/// rewritten holds one version of them, not two.
inline void replace_constant(Graph& g, Node& n, std::size_t i, at::Tensor value, const std::string& suffix) {
  const std::string old = n.inputs[i], name = g.unique_name(old + suffix);
  g.initializers[name] = std::move(value);
  n.inputs[i] = name;
  if (g.is_graph_output(old) || !g.consumers(old).empty()) return;
  for (const Node* m : g.nodes())
    for (const auto& v : m->implicit_inputs())
      if (v == old) return;
  g.initializers.erase(old);
}

/// Multiplies `axis` of constant input `i` of `n` by `s`.
inline void scale_constant(Graph& g, Node& n, std::size_t i, std::int64_t axis, const at::Tensor& s) {
  const at::Tensor& w = g.initializers.at(n.inputs[i]);
  std::vector<std::int64_t> shape(static_cast<std::size_t>(w.dim()), 1);
  shape[static_cast<std::size_t>(axis)] = s.numel();
  replace_constant(g, n, i, (w.to(at::kDouble) * s.to(at::kDouble).reshape(shape)).to(w.scalar_type()).contiguous(),
                   "_scaled");
}

/// True when `value` is read by exactly the nodes in `readers` (counted with multiplicity) and is
/// no graph output, so changing it changes nothing else.
inline bool read_only_by(const Graph& g, const std::string& value, std::size_t readers) {
  return !g.is_graph_output(value) && g.consumers(value).size() == readers;
}

/// Folds 1/s (`inv`) into `p`, the producer of X, when X's channels (`x_axis`: 1 or -1) are its
/// output channels; false when `p` is no op this knows how to scale.
inline bool fold_into_producer(Graph& g, Node* p, std::int64_t x_axis, const at::Tensor& inv) {
  if (!p || !p->domain.empty() || p->outputs.size() != 1) return false;
  const std::int64_t k = inv.numel();
  auto vector_of = [&](const Node& n, std::size_t i) {
    return float_constant(g, n, i) && g.initializers.at(n.inputs[i]).dim() == 1 &&
           g.initializers.at(n.inputs[i]).numel() == k;
  };
  if (p->op_type == "LayerNormalization" && x_axis == -1 && p->attr_int("axis", -1) == -1 && vector_of(*p, 1) &&
      (!p->has_input(2) || vector_of(*p, 2))) {
    scale_constant(g, *p, 1, 0, inv);
    if (p->has_input(2)) scale_constant(g, *p, 2, 0, inv);
    return true;
  }
  // RMSNorm as Llama exporters write it: ... Mul(normalized, gamma), or LayerNormalization's
  // opset-11 form, that Mul followed by Add(., beta).
  if (p->op_type == "Mul" && x_axis == -1 && p->inputs.size() == 2) {
    for (std::size_t c = 0; c < 2; ++c)
      if (vector_of(*p, c)) {
        scale_constant(g, *p, c, 0, inv);
        return true;
      }
    // A gated product (SwiGLU: SiLU(gate) * up): scale one factor where it is computed.
    for (std::size_t c = 0; c < 2; ++c) {
      if (p->inputs[0] == p->inputs[1] || !read_only_by(g, p->inputs[c], 1)) continue;
      Node* q = g.producer(p->inputs[c]);
      if (q && (q->op_type == "MatMul" || q->op_type == "Gemm") && fold_into_producer(g, q, x_axis, inv)) return true;
    }
    return false;
  }
  if (p->op_type == "Add" && x_axis == -1 && p->inputs.size() == 2) {
    for (std::size_t c = 0; c < 2; ++c) {
      Node* mul = g.producer(p->inputs[1 - c]);
      if (!vector_of(*p, c) || !mul || mul->op_type != "Mul" || !mul->domain.empty() ||
          !read_only_by(g, mul->outputs[0], 1))
        continue;
      for (std::size_t m = 0; m < 2; ++m) {
        if (!vector_of(*mul, m)) continue;
        scale_constant(g, *mul, m, 0, inv);
        scale_constant(g, *p, c, 0, inv);
        return true;
      }
    }
  }
  if (p->op_type == "BatchNormalization" && x_axis == 1 && vector_of(*p, 1) && vector_of(*p, 2)) {
    scale_constant(g, *p, 1, 0, inv);
    scale_constant(g, *p, 2, 0, inv);
    return true;
  }
  // Weighted producers: their output channel axis of the weight, and the bias input.
  std::int64_t out_axis = -1;
  if (p->op_type == "Conv" && x_axis == 1 && float_constant(g, *p, 1)) out_axis = 0;
  if (p->op_type == "MatMul" && x_axis == -1 && float_constant(g, *p, 1) && g.initializers.at(p->inputs[1]).dim() == 2)
    out_axis = 1;
  if (p->op_type == "Gemm" && x_axis == -1 && float_constant(g, *p, 1)) out_axis = p->attr_int("transB", 0) ? 0 : 1;
  if (out_axis < 0 || g.initializers.at(p->inputs[1]).size(out_axis) != k) return false;
  const bool has_bias = p->op_type != "MatMul" && p->has_input(2);
  if (has_bias && !vector_of(*p, 2)) return false;  // a broadcast Gemm bias: leave it to the Mul
  scale_constant(g, *p, 1, out_axis, inv);
  if (has_bias) scale_constant(g, *p, 2, 0, inv);
  return true;
}

/// Divides channel `x_axis` of X by s for `readers` (all reading X as input 0) and multiplies their
/// weight rows by s: 1/s folds into X's producer when the readers are X's only readers, else a
/// Mul named after `tag` goes in front of the first reader. Returns whether it folded.
inline bool scale_channels(Graph& g, const std::string& x, std::int64_t x_axis,
                           const std::vector<ScaledReader>& readers, const at::Tensor& s, const std::string& tag) {
  const at::Tensor inv = 1.0 / s.to(at::kDouble);
  const bool folded = read_only_by(g, x, readers.size()) && fold_into_producer(g, g.producer(x), x_axis, inv);
  if (!folded) {
    Node mul;
    mul.op_type = "Mul";
    mul.name = g.unique_name(x + "_" + tag);
    const std::string factor = g.unique_name(x + "_" + tag + "_factor");
    std::vector<std::int64_t> shape{inv.numel()};
    if (x_axis == 1) {  // channels first: [C, 1, ...] against X of the weight's rank
      const std::int64_t rank = g.initializers.at(readers[0].node->inputs[1]).dim();
      for (std::int64_t d = 2; d < rank; ++d) shape.push_back(1);
    }
    g.initializers[factor] = inv.to(at::kFloat).reshape(shape).contiguous();
    const std::string scaled = g.unique_name(x + "_" + tag + "_scaled");
    mul.inputs = {x, factor};
    mul.outputs = {scaled};
    g.insert_before(readers[0].node, std::move(mul));  // the first reader in graph order
    for (const ScaledReader& r : readers) r.node->inputs[0] = scaled;
  }
  for (const ScaledReader& r : readers) scale_constant(g, *r.node, 1, r.weight_axis, s);
  return folded;
}

}  // namespace sparsebit::passes
