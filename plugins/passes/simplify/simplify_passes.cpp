// Simplify-stage passes (they run before conversion and keep the float function):
//   remove_identity   Identity and inference-mode Dropout disappear
//   fold_constants    nodes whose inputs are all constant become initializers (shape arithmetic too),
//                     inside control-flow bodies as well
//   fuse_bn           Conv / ConvTranspose / Gemm followed by BatchNormalization become one node;
//                     the weight quantizer is built after folding, so its per-channel scales see
//                     the folded weights
//   fuse_matmul_add   MatMul(x, W) + b with a 2-D x, constant W and 1-D b becomes Gemm
//   fuse_hardswish    x * HardSigmoid(x) (alpha 1/6, beta 1/2) becomes HardSwish (opset >= 14)
//   fuse_gelu         0.5 * x * (1 + Erf(x / sqrt(2))) becomes Gelu (opset >= 20)
//   fuse_layernorm    ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div (+ Mul, Add) becomes
//                     LayerNormalization (opset >= 17)
//   fuse_pad          a zero Pad on the spatial axes only, read by a Conv alone, becomes the Conv's
//                     own pads (TensorFlow's SAME padding exports as Pad -> Conv)
//   move_transposes   Transpose -> elementwise activation becomes activation -> Transpose, so the
//                     NCHW <-> NHWC Transposes TensorFlow exporters put around each convolution
//                     meet and merge_transposes removes them
//   fuse_activations  activations written as arithmetic (TensorFlow exporters): Max(x, a * x)
//                     with 0 <= a < 1 becomes LeakyRelu (Relu for a = 0), Max / Min with a scalar
//                     constant becomes Relu or Clip, and a Relu or one-sided Clip followed by a
//                     one-sided Clip becomes one Clip (ReLU6 as Relu -> Min 6). Backends fuse these
//                     into the convolution before them only as activation ops.
// Fusions into ops newer than the model's opset are skipped (with a debug message): the
// exported model keeps the opset it came with.

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "sparsebit/sdk/batchnorm.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/pattern.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

using Inputs = Pattern::Inputs;

std::optional<at::Tensor> constant(const Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  if (it == g.initializers.end()) return std::nullopt;
  return it->second;
}

/// The value of a one-element floating constant input.
std::optional<double> scalar(const Graph& g, const std::string& name) {
  auto t = constant(g, name);
  if (!t || t->numel() != 1 || !t->is_floating_point()) return std::nullopt;
  return t->reshape({}).item<double>();
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b)); }

/// The operand of a two-input node that is not `value` (for commutative ops), or "".
std::string other_input(const Node& n, const std::string& value) {
  if (n.inputs.size() != 2) return "";
  return n.inputs[0] == value ? n.inputs[1] : n.inputs[1] == value ? n.inputs[0] : "";
}

bool opset_at_least(const Graph& g, std::int64_t v, const char* pass, const char* op) {
  if (g.default_opset() >= v) return true;
  sdk::log_debug(std::string(pass) + ": the model's opset " + std::to_string(g.default_opset()) + " has no " + op +
                 " (needs " + std::to_string(v) + "); pattern left as is");
  return false;
}

class RemoveIdentity final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern p;
    p.node("id", {"Identity", "Dropout"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      if (n.op_type == "Dropout") {
        // Only in inference mode, and only when nothing reads the mask.
        if (n.outputs.size() > 1 && !n.outputs[1].empty()) return false;
        if (n.has_input(2)) {
          auto training = constant(graph, n.inputs[2]);
          if (!training || training->reshape({}).item<bool>()) return false;
        }
      }
      // A graph output keeps its name (and its producer).
      return n.has_input(0) && !graph.is_graph_output(n.outputs[0]);
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             const Node* n = m.at("id");
             graph.replace_all_uses(n->outputs[0], n->inputs[0]);
             return true;
           }) > 0;
  }
};

class FoldConstants final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext& ctx) override {
    if (!ctx.evaluate) return false;
    Folded folded;
    return fold(g, {}, ctx, ctx.options.get_int("max_elements", 1 << 24), folded);
  }

 private:
  // Per graph: what a node computed from constants -> the names of its folded outputs.
  using Folded = std::map<const Graph*, std::map<std::string, std::vector<std::string>>>;

  // Inputs of up to this many elements (axes, starts, shapes) are told apart by their values,
  // larger ones (weights) by their names.
  static constexpr std::int64_t kByValue = 64;

  /// What node `n` computes from `inputs` (its constant inputs), for spotting two nodes that
  /// compute the same; empty where an attribute is a tensor or a graph.
  static std::string signature(const Node& n, const std::vector<at::Tensor>& inputs) {
    std::ostringstream s;
    s.precision(17);
    s << n.op_type << "(";
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (!inputs[i].defined() || inputs[i].numel() > kByValue) {
        s << n.inputs[i] << ",";
        continue;
      }
      const at::Tensor v = inputs[i].to(at::kDouble).contiguous();
      s << inputs[i].scalar_type() << inputs[i].sizes() << "[";
      for (std::int64_t k = 0; k < v.numel(); ++k) s << v.data_ptr<double>()[k] << " ";
      s << "],";
    }
    for (const auto& [key, a] : n.attributes) {
      s << ";" << key << "=";
      switch (a.kind) {
        case Attribute::Kind::kInt: s << a.i; break;
        case Attribute::Kind::kFloat: s << a.f; break;
        case Attribute::Kind::kString: s << a.s.size() << ":" << a.s; break;
        case Attribute::Kind::kInts:
          for (auto v : a.ints) s << v << ",";
          break;
        case Attribute::Kind::kFloats:
          for (auto v : a.floats) s << v << ",";
          break;
        default: return {};
      }
    }
    s << ")";
    return s.str();
  }

  // Folds in `g` and, recursively, in its control-flow bodies, where the initializers of the
  // enclosing graphs (`outer`, innermost last) count as constants too: an exporter that writes
  // a body's weights as Constant -> Unsqueeze -> Concat leaves them computed otherwise.
  // Note [Folding in bodies]: a node of a body that computes from the weights of enclosing graphs
  // (and small constants of its own: axes, starts, ends) is folded into the innermost graph
  // holding those weights, once: sibling bodies often compute the same from the same weights
  // (Silero VAD's two LSTM branches each slice, reorder and unsqueeze the enclosing branch's LSTM
  // weights), and a copy per body would make the export larger than the model it came from.
  static bool fold(Graph& g, std::vector<Graph*> outer, const PassContext& ctx, std::int64_t limit, Folded& folded) {
    // The graph holding constant `name`: g, an enclosing graph, or nullptr.
    auto holder = [&](const std::string& name) -> Graph* {
      if (g.initializers.count(name)) return &g;
      for (auto o = outer.rbegin(); o != outer.rend(); ++o)
        if ((*o)->initializers.count(name)) return *o;
      return nullptr;
    };
    bool changed = false;
    for (Node* n : g.nodes()) {
      if (!n->domain.empty() || n->outputs.empty()) continue;
      if (n->op_type == "If" || n->op_type == "Loop" || n->op_type == "Scan") {
        std::vector<Graph*> inner = outer;
        inner.push_back(&g);
        for (auto& kv : n->attributes)
          if (kv.second.kind == Attribute::Kind::kGraph && kv.second.graph)
            changed = fold(*kv.second.graph, inner, ctx, limit, folded) || changed;
        continue;
      }
      // Where the folded outputs go: the innermost graph holding one of its weights.
      std::size_t depth = 0;
      bool all_constant = true, weights = false;
      std::vector<at::Tensor> inputs;
      for (const auto& in : n->inputs) {
        if (in.empty()) {
          inputs.emplace_back();
          continue;
        }
        Graph* h = holder(in);
        if (!h) {
          all_constant = false;
          break;
        }
        inputs.push_back(h->initializers.at(in));
        if (inputs.back().numel() <= kByValue) continue;
        weights = true;
        depth = std::max(depth,
                         h == &g ? outer.size()
                                 : static_cast<std::size_t>(std::find(outer.begin(), outer.end(), h) - outer.begin()));
      }
      if (!all_constant) continue;
      Graph& target = !weights || depth == outer.size() ? g : *outer[depth];
      const std::string key = &target == &g ? std::string() : signature(*n, inputs);
      if (!key.empty()) {
        if (auto it = folded[&target].find(key);
            it != folded[&target].end() && it->second.size() == n->outputs.size()) {
          for (std::size_t i = 0; i < n->outputs.size(); ++i)
            if (!n->outputs[i].empty()) g.replace_all_uses(n->outputs[i], it->second[i]);
          g.erase(n);
          changed = true;
          continue;
        }
      }
      std::vector<at::Tensor> out;
      try {
        out = ctx.evaluate(*n, inputs);
      } catch (const Error& e) {
        sdk::log_debug("fold_constants: " + n->describe() + " kept: " + e.what());
        continue;
      }
      bool fits = out.size() >= n->outputs.size();
      for (std::size_t i = 0; i < n->outputs.size() && fits; ++i)
        fits = n->outputs[i].empty() || (out[i].defined() && !out[i].is_nested() && out[i].numel() <= limit);
      // A sequence (a nested tensor, SequenceEmpty's) is no initializer; a graph output stays
      // computed by a node, so that the model's outputs keep their producers.
      for (const auto& o : n->outputs) fits = fits && !g.is_graph_output(o);
      if (!fits) continue;
      for (std::size_t i = 0; i < n->outputs.size(); ++i)
        if (!n->outputs[i].empty()) target.initializers[n->outputs[i]] = out[i].detach().contiguous();
      if (!key.empty()) folded[&target][key] = n->outputs;
      g.erase(n);
      changed = true;
    }
    if (changed) g.prune_dead();
    return changed;
  }
};

/// Folds the per-channel affine map `affine` that `absorbed` (the only reader of `op`'s output)
/// applies into `op`'s weight and bias, and removes `absorbed`; false where the channels differ.
/// The new weight is named after the old one with `suffix`.
bool fold_affine(Graph& g, Node& op, const BatchNormAffine& affine, const Node& absorbed, const std::string& suffix) {
  const at::Tensor& s = affine.scale;
  at::Tensor w = g.initializers.at(op.inputs[1]).to(at::kDouble);
  const std::int64_t channels = s.numel();
  at::Tensor w2;
  if (op.op_type == "Conv") {
    if (w.size(0) != channels) return false;
    std::vector<std::int64_t> shape(static_cast<std::size_t>(w.dim()), 1);
    shape[0] = channels;
    w2 = w * s.reshape(shape);
  } else if (op.op_type == "ConvTranspose") {
    // W is [C_in, C_out / group, k...]; output channel g * (C_out / group) + j.
    const std::int64_t groups = op.attr_int("group", 1);
    if (w.size(1) * groups != channels || w.size(0) % groups) return false;
    std::vector<std::int64_t> shape{groups, w.size(0) / groups, w.size(1)}, sshape{groups, 1, w.size(1)};
    for (std::int64_t d = 2; d < w.dim(); ++d) {
      shape.push_back(w.size(d));
      sshape.push_back(1);
    }
    w2 = (w.reshape(shape) * s.reshape(sshape)).reshape(w.sizes());
  } else {  // Gemm: output channels are N; alpha scales A * B, so it is folded into B first
    const bool trans_b = op.attr_int("transB", 0) != 0;
    if (w.size(trans_b ? 0 : 1) != channels) return false;
    w = w * op.attr_float("alpha", 1.0);
    w2 = trans_b ? w * s.reshape({channels, 1}) : w * s.reshape({1, channels});
  }
  at::Tensor b = at::zeros({channels}, at::kDouble);
  if (op.has_input(2)) {
    b = g.initializers.at(op.inputs[2]).to(at::kDouble);
    if (op.op_type == "Gemm") b = b * op.attr_float("beta", 1.0);
    if (b.numel() == 1) b = b.expand({channels});
    if (b.numel() != channels) return false;
  }
  const at::Tensor b2 = affine.fold_bias(b);
  const auto dtype = g.initializers.at(op.inputs[1]).scalar_type();
  const std::string wn = g.unique_name(op.inputs[1] + suffix),
                    bname =
                        g.unique_name((absorbed.inputs.size() > 2 ? absorbed.inputs[2] : absorbed.name) + "_folded");
  g.initializers[wn] = w2.to(dtype).contiguous();
  g.initializers[bname] = b2.to(dtype).contiguous();
  op.inputs.resize(3);
  op.inputs[1] = wn;
  op.inputs[2] = bname;
  if (op.op_type == "Gemm") {
    op.attributes.erase("alpha");
    op.attributes.erase("beta");
  }
  // `op` now writes what `absorbed` wrote (its old output had no other reader).
  for (auto& out : op.outputs)
    if (std::find(absorbed.inputs.begin(), absorbed.inputs.end(), out) != absorbed.inputs.end())
      out = absorbed.outputs[0];
  g.erase(&absorbed);
  return true;
}

/// Whether `n` is a Conv / ConvTranspose / Gemm whose weight (and bias) are constants that
/// folding can rewrite.
bool foldable_layer(const Node& n, const Graph& graph) {
  if (!n.has_input(1) || !graph.initializers.count(n.inputs[1])) return false;
  if (n.has_input(2) && (!graph.initializers.count(n.inputs[2]) || graph.initializers.at(n.inputs[2]).dim() != 1))
    return false;
  if (n.op_type == "Gemm" && (n.attr_int("transA", 0) != 0 || graph.initializers.at(n.inputs[1]).dim() != 2))
    return false;
  return true;
}

class FuseBatchNorm final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern p;
    p.node("op", {"Conv", "ConvTranspose", "Gemm"}, {}, Inputs::kOrdered, foldable_layer);
    p.node("bn", {"BatchNormalization"}, {"op"}, Inputs::kOrdered,
           [](const Node& n, const Graph& graph) { return batchnorm_affine(graph, n).has_value(); });
    return rewrite(g, p, [](Graph& graph, const Match& m) { return fold(graph, *m.at("op"), *m.at("bn")); }) > 0;
  }

 private:
  static bool fold(Graph& g, Node& op, const Node& bn) {
    return fold_affine(g, op, *batchnorm_affine(g, bn), bn, "_bn");  // Note [BatchNormalization as an affine map]
  }
};

// fuse_affine: a Mul, Add, Sub or Div by a constant after a layer, per output channel or one
// value for all, folds into the layer's weight and bias (Note [BatchNormalization as an affine
// map]); a Mul, Add, Sub or Div by one value before a layer without padding folds in too:
// W (a x + b) = (a W) x + b sum(W). PaddlePaddle's exports write PP-LCNet's learnable affine
// blocks this way, two element-wise passes around most convolutions that no runtime fuses.
class FuseAffine final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern after;
    after.node("op", {"Conv", "ConvTranspose", "Gemm"}, {}, Inputs::kOrdered, foldable_layer);
    after.node("aff", {"Mul", "Add", "Sub", "Div"}, {"op"}, Inputs::kAnyOrder);
    std::size_t n = rewrite(g, after, [](Graph& graph, const Match& m) {
      Node& op = *m.at("op");
      const auto affine = map_after(graph, op, *m.at("aff"));
      return affine && fold_affine(graph, op, *affine, *m.at("aff"), "_affine");
    });
    Pattern before;
    before.node("aff", {"Mul", "Add", "Sub", "Div"});
    before.node("op", {"Conv", "Gemm"}, {"aff"}, Inputs::kOrdered, foldable_layer);
    n += rewrite(g, before, [](Graph& graph, const Match& m) { return fold_before(graph, *m.at("aff"), *m.at("op")); });
    return n > 0;
  }

 private:
  /// Output channels of a foldable layer.
  static std::int64_t channels(const Graph& g, const Node& op) {
    const at::Tensor& w = g.initializers.at(op.inputs[1]);
    if (op.op_type == "Conv") return w.size(0);
    if (op.op_type == "ConvTranspose") return w.size(1) * op.attr_int("group", 1);
    return w.size(op.attr_int("transB", 0) ? 0 : 1);
  }

  /// The constant operand of `aff` (the other one being `x`) as `channels` values along the
  /// channel axis (axis 1) of a rank-`rank` output, or nullopt where it broadcasts otherwise.
  static std::optional<at::Tensor> per_channel(const Graph& g, const Node& aff, const std::string& x,
                                               std::int64_t channels, std::int64_t rank) {
    const auto c = constant(g, other_input(aff, x));
    if (!c || !c->is_floating_point() || c->numel() == 0) return std::nullopt;
    if ((aff.op_type == "Sub" || aff.op_type == "Div") && aff.inputs[0] != x) return std::nullopt;
    if (c->numel() == 1) return c->to(at::kDouble).reshape({1}).expand({channels}).contiguous();
    const std::int64_t j = c->dim() - (rank - 1);  // the channel axis, counted from the right
    if (c->dim() > rank || j < 0) return std::nullopt;
    for (std::int64_t d = 0; d < c->dim(); ++d)
      if (c->size(d) != (d == j ? channels : 1)) return std::nullopt;
    return c->to(at::kDouble).reshape({channels});
  }

  /// y = x k + shift for the element-wise `aff` reading `x` and a constant.
  static std::optional<BatchNormAffine> affine_of(const Node& aff, const at::Tensor& c) {
    const at::Tensor one = at::ones_like(c), zero = at::zeros_like(c);
    if (aff.op_type == "Mul") return BatchNormAffine{c, zero};
    if (aff.op_type == "Div")
      return (c != 0).all().item<bool>() ? std::optional(BatchNormAffine{1 / c, zero}) : std::nullopt;
    if (aff.op_type == "Add") return BatchNormAffine{one, c};
    return BatchNormAffine{one, -c};  // Sub
  }

  static std::optional<BatchNormAffine> map_after(const Graph& g, const Node& op, const Node& aff) {
    const std::int64_t rank = op.op_type == "Gemm" ? 2 : g.initializers.at(op.inputs[1]).dim();
    const auto c = per_channel(g, aff, op.outputs[0], channels(g, op), rank);
    return c ? affine_of(aff, *c) : std::nullopt;
  }

  /// W (a x + b): the weight becomes a W and the bias gains b sum(W) per output channel.
  static bool fold_before(Graph& g, const Node& aff, Node& op) {
    if (op.inputs[0] != aff.outputs[0] || g.consumers(aff.outputs[0]).size() != 1 || g.is_graph_output(aff.outputs[0]))
      return false;
    if (op.op_type == "Conv") {
      for (std::int64_t p : op.attr_ints("pads", {}))
        if (p != 0) return false;  // the padding's zeros would not be mapped
      const std::string pad = op.attr_string("auto_pad", "NOTSET");
      if (pad != "NOTSET" && pad != "VALID") return false;
    }
    std::string input;
    for (const auto& in : aff.inputs)
      if (!g.initializers.count(in)) input = in;
    if (input.empty()) return false;
    const auto c = per_channel(g, aff, input, 1, 1);  // one value only
    if (!c) return false;
    const auto affine = affine_of(aff, *c);
    if (!affine) return false;
    const double a = affine->scale.item<double>(), b = affine->shift.item<double>();
    at::Tensor w = g.initializers.at(op.inputs[1]).to(at::kDouble);
    const std::int64_t out = channels(g, op);
    at::Tensor bias =
        op.has_input(2) ? g.initializers.at(op.inputs[2]).to(at::kDouble).reshape({-1}) : at::zeros({1}, at::kDouble);
    if (bias.numel() == 1) bias = bias.expand({out});
    if (bias.numel() != out) return false;
    at::Tensor sums;
    if (op.op_type == "Conv") {
      std::vector<std::int64_t> dims;
      for (std::int64_t d = 1; d < w.dim(); ++d) dims.push_back(d);
      sums = w.sum(dims);
    } else {  // Gemm: alpha A B + beta C, A = a x + b
      w = w * op.attr_float("alpha", 1.0);
      bias = bias * op.attr_float("beta", 1.0);
      sums = w.sum(op.attr_int("transB", 0) ? 1 : 0);
    }
    const auto dtype = g.initializers.at(op.inputs[1]).scalar_type();
    const std::string wn = g.unique_name(op.inputs[1] + "_affine"), bn = g.unique_name(op.name + "_bias_affine");
    g.initializers[wn] = (w * a).to(dtype).contiguous();
    g.initializers[bn] = (bias + sums * b).to(dtype).contiguous();
    op.inputs.resize(3);
    op.inputs[0] = input;
    op.inputs[1] = wn;
    op.inputs[2] = bn;
    if (op.op_type == "Gemm") {
      op.attributes.erase("alpha");
      op.attributes.erase("beta");
    }
    return true;
  }
};

// fuse_hardsigmoid: HardSigmoid and HardSwish written out as arithmetic, as PaddlePaddle's and
// older exporters write them, become HardSigmoid: Clip(x + 3, 0, 6) / 6 -> HardSigmoid(x) (alpha
// 1/6, beta 1/2) and x * Clip(x + 3, 0, 6) / 6 -> x * HardSigmoid(x) (fuse_hardswish then makes
// HardSwish of that from opset 14). Four element-wise passes become one or two. A division by 6
// may also be a multiplication by 1/6.
class FuseHardSigmoid final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern swish;
    swish.node("add", {"Add"}, {}, Inputs::kAnyOrder, plus_three);
    swish.node("clip", {"Clip"}, {"add"}, Inputs::kOrdered, zero_to_six);
    swish.node("mul", {"Mul"}, {"clip"}, Inputs::kAnyOrder);
    swish.node("div", {"Div", "Mul"}, {"mul"}, Inputs::kOrdered, by_six);
    swish.joint([](const Match& m, const Graph& graph) {
      return other_input(*m.at("mul"), m.at("clip")->outputs[0]) == x_of(graph, *m.at("add"));
    });
    std::size_t n = rewrite(g, swish, [](Graph& graph, const Match& m) {
      const std::string x = x_of(graph, *m.at("add"));
      Node& mul = *m.at("mul");
      Node hs = hard_sigmoid(graph, x, m.at("add")->name);
      mul.inputs = {x, hs.outputs[0]};
      mul.outputs = {m.at("div")->outputs[0]};
      graph.insert_before(&mul, std::move(hs));
      graph.erase(m.at("div"));
      return true;
    });
    Pattern sigmoid;
    sigmoid.node("add", {"Add"}, {}, Inputs::kAnyOrder, plus_three);
    sigmoid.node("clip", {"Clip"}, {"add"}, Inputs::kOrdered, zero_to_six);
    sigmoid.node("div", {"Div", "Mul"}, {"clip"}, Inputs::kOrdered, by_six);
    n += rewrite(g, sigmoid, [](Graph& graph, const Match& m) {
      Node hs = hard_sigmoid(graph, x_of(graph, *m.at("add")), m.at("add")->name);
      hs.outputs = {m.at("div")->outputs[0]};
      graph.insert_before(m.at("div"), std::move(hs));
      graph.erase(m.at("div"));
      return true;
    });
    return n > 0;
  }

 private:
  static std::string x_of(const Graph& g, const Node& add) {
    return scalar(g, add.inputs[1]) ? add.inputs[0] : add.inputs[1];
  }
  static bool plus_three(const Node& n, const Graph& g) {
    if (n.inputs.size() != 2) return false;
    const auto a = scalar(g, n.inputs[0]), b = scalar(g, n.inputs[1]);
    return (b && near(*b, 3.0) && !a) || (a && near(*a, 3.0) && !b);
  }
  static bool zero_to_six(const Node& n, const Graph& g) {
    if (n.has_attr("min") || n.has_attr("max"))  // before opset 11
      return near(n.attr_float("min", -1), 0.0) && near(n.attr_float("max", -1), 6.0);
    if (!n.has_input(1) || !n.has_input(2)) return false;
    const auto lo = scalar(g, n.inputs[1]), hi = scalar(g, n.inputs[2]);
    return lo && hi && near(*lo, 0.0) && near(*hi, 6.0);
  }
  static bool by_six(const Node& n, const Graph& g) {
    if (n.inputs.size() != 2) return false;
    const auto c = scalar(g, n.inputs[1]);
    return c && near(*c, n.op_type == "Div" ? 6.0 : 1.0 / 6);
  }
  static Node hard_sigmoid(Graph& g, const std::string& x, const std::string& base) {
    Node hs;
    hs.op_type = "HardSigmoid";
    hs.name = g.unique_name(base + "_hardsigmoid");
    hs.inputs = {x};
    hs.outputs = {g.unique_name(base + "_hardsigmoid")};
    hs.attributes["alpha"] = Attribute::of_float(1.0 / 6);
    hs.attributes["beta"] = Attribute::of_float(0.5);
    return hs;
  }
};

class FuseMatMulAdd final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern p;
    p.node("mm", {"MatMul"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      auto w = constant(graph, n.inputs.size() > 1 ? n.inputs[1] : "");
      return w && w->dim() == 2;
    });
    p.node("add", {"Add"}, {"mm"}, Inputs::kAnyOrder);
    p.joint([](const Match& m, const Graph& graph) {
      const Node& mm = *m.at("mm");
      auto b = constant(graph, other_input(*m.at("add"), mm.outputs[0]));
      return b && b->dim() == 1 && b->numel() == graph.initializers.at(mm.inputs[1]).size(1);
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& mm = *m.at("mm");
             const Node& add = *m.at("add");
             if (!two_dimensional(graph, mm.inputs[0])) return false;  // Gemm's A must be 2-D
             mm.op_type = "Gemm";
             mm.inputs.push_back(other_input(add, mm.outputs[0]));
             mm.outputs[0] = add.outputs[0];
             graph.erase(&add);
             return true;
           }) > 0;
  }

 private:
  /// Whether `value` is known to be 2-D without running the model: a 2-D graph input, or the
  /// output of Flatten, Gemm or a Reshape to a constant two-element shape.
  static bool two_dimensional(Graph& g, const std::string& value) {
    for (const auto& in : g.inputs)
      if (in.name == value) return in.has_shape && in.shape.size() == 2;
    const Node* p = g.producer(value);
    if (!p || !p->domain.empty()) return false;
    if (p->op_type == "Flatten" || p->op_type == "Gemm") return true;
    if (p->op_type == "Reshape") {
      auto shape = constant(g, p->inputs.size() > 1 ? p->inputs[1] : "");
      return shape && shape->numel() == 2;
    }
    return false;
  }
};

class FuseHardSwish final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    if (!opset_at_least(g, 14, "fuse_hardswish", "HardSwish")) return false;
    Pattern p;
    p.node("hs", {"HardSigmoid"}, {}, Inputs::kOrdered, [](const Node& n, const Graph&) {
      return near(n.attr_float("alpha", 0.2), 1.0 / 6) && near(n.attr_float("beta", 0.5), 0.5);
    });
    p.node("mul", {"Mul"}, {"hs"}, Inputs::kAnyOrder);
    p.joint([](const Match& m, const Graph&) {
      return other_input(*m.at("mul"), m.at("hs")->outputs[0]) == m.at("hs")->inputs[0];
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& hs = *m.at("hs");
             const Node& mul = *m.at("mul");
             hs.op_type = "HardSwish";
             hs.attributes.clear();
             hs.outputs[0] = mul.outputs[0];
             graph.erase(&mul);
             return true;
           }) > 0;
  }
};

class FuseGelu final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    if (!opset_at_least(g, 20, "fuse_gelu", "Gelu")) return false;
    // torch exports Gelu as Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5) (either operand order).
    Pattern p;
    p.node("div", {"Div"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      auto c = scalar(graph, n.inputs.size() > 1 ? n.inputs[1] : "");
      return c && near(*c, std::sqrt(2.0));
    });
    p.node("erf", {"Erf"}, {"div"});
    p.node("add", {"Add"}, {"erf"}, Inputs::kAnyOrder, [](const Node& n, const Graph& graph) {
      auto a = scalar(graph, n.inputs[0]), b = scalar(graph, n.inputs[1]);
      return (a && near(*a, 1.0)) || (b && near(*b, 1.0));
    });
    p.node("mul", {"Mul"}, {"add"}, Inputs::kAnyOrder);
    p.node("half", {"Mul"}, {"mul"}, Inputs::kAnyOrder, [](const Node& n, const Graph& graph) {
      auto a = scalar(graph, n.inputs[0]), b = scalar(graph, n.inputs[1]);
      return (a && near(*a, 0.5)) || (b && near(*b, 0.5));
    });
    p.joint([](const Match& m, const Graph&) {
      return other_input(*m.at("mul"), m.at("add")->outputs[0]) == m.at("div")->inputs[0];
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& div = *m.at("div");
             div.op_type = "Gelu";
             div.inputs.resize(1);
             div.attributes.clear();
             div.outputs[0] = m.at("half")->outputs[0];
             graph.erase(m.at("half"));  // the rest becomes dead and is pruned
             return true;
           }) > 0;
  }
};

class FuseLayerNorm final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    if (!opset_at_least(g, 17, "fuse_layernorm", "LayerNormalization")) return false;
    return rewrite(g, pattern(), fuse) > 0;
  }

 private:
  /// Trailing axes (all negative, consecutive, ending at -1) of a ReduceMean, as given.
  static std::optional<std::vector<std::int64_t>> axes(const Node& n, const Graph& g) {
    if (n.attr_int("keepdims", 1) != 1) return std::nullopt;
    std::vector<std::int64_t> a = n.attr_ints("axes");
    if (n.has_input(1)) {
      auto t = constant(g, n.inputs[1]);
      if (!t) return std::nullopt;
      at::Tensor v = t->to(at::kLong).contiguous().reshape({-1});
      a.assign(v.data_ptr<std::int64_t>(), v.data_ptr<std::int64_t>() + v.numel());
    }
    std::sort(a.begin(), a.end());
    if (a.empty() || a.back() != -1) return std::nullopt;
    for (std::size_t i = 1; i < a.size(); ++i)
      if (a[i] != a[i - 1] + 1) return std::nullopt;
    return a;
  }

  static Pattern pattern() {
    auto reduce = [](const Node& n, const Graph& g) { return axes(n, g).has_value(); };
    Pattern p;
    p.node("mean", {"ReduceMean"}, {}, Inputs::kOrdered, reduce);
    p.node("sub", {"Sub"}, {"", "mean"});
    p.node("pow", {"Pow"}, {"sub"}, Inputs::kOrdered, [](const Node& n, const Graph& g) {
      auto e = scalar(g, n.inputs.size() > 1 ? n.inputs[1] : "");
      return e && *e == 2.0;
    });
    p.node("var", {"ReduceMean"}, {"pow"}, Inputs::kOrdered, reduce);
    p.node("eps", {"Add"}, {"var"}, Inputs::kAnyOrder);
    p.node("sqrt", {"Sqrt"}, {"eps"});
    p.node("div", {"Div"}, {"sub", "sqrt"});
    p.node("scale", {"Mul"}, {"div"}, Inputs::kAnyOrder);
    p.node("shift", {"Add"}, {"scale"}, Inputs::kAnyOrder);
    p.joint([](const Match& m, const Graph& g) {
      const Node& mean = *m.at("mean");
      if (m.at("sub")->inputs[0] != mean.inputs[0] || axes(mean, g) != axes(*m.at("var"), g)) return false;
      if (!scalar(g, other_input(*m.at("eps"), m.at("var")->outputs[0]))) return false;
      auto gamma = constant(g, other_input(*m.at("scale"), m.at("div")->outputs[0]));
      auto beta = constant(g, other_input(*m.at("shift"), m.at("scale")->outputs[0]));
      return gamma && beta && gamma->dim() >= 1 && beta->dim() >= 1;
    });
    return p;
  }

  static bool fuse(Graph& g, const Match& m) {
    const Node& mean = *m.at("mean");
    Node ln;
    ln.name = g.unique_name(m.at("div")->name + "_layernorm");
    ln.op_type = "LayerNormalization";
    ln.attributes["axis"] = Attribute::of_int(axes(mean, g)->front());
    ln.attributes["epsilon"] = Attribute::of_float(*scalar(g, other_input(*m.at("eps"), m.at("var")->outputs[0])));
    ln.inputs = {mean.inputs[0], other_input(*m.at("scale"), m.at("div")->outputs[0]),
                 other_input(*m.at("shift"), m.at("scale")->outputs[0])};
    Node* tail = m.at("shift");
    ln.outputs = {tail->outputs[0]};
    g.insert_after(tail, std::move(ln));
    g.erase(tail);  // the rest becomes dead and is pruned
    return true;
  }
};

class FusePad final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    Pattern p;
    p.node("pad", {"Pad"}, {}, Inputs::kOrdered,
           [](const Node& n, const Graph& graph) { return spatial_pads(graph, n).has_value(); });
    p.node("conv", {"Conv"}, {"pad"}, Inputs::kOrdered,
           [](const Node& n, const Graph&) { return n.attr_string("auto_pad", "NOTSET") == "NOTSET"; });
    p.joint([](const Match& m, const Graph& graph) {
      const auto pads = *spatial_pads(graph, *m.at("pad"));
      const Node& conv = *m.at("conv");
      const auto own = conv.attr_ints("pads");
      return own.empty() || own.size() == pads.size();
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             const Node& pad = *m.at("pad");
             Node& conv = *m.at("conv");
             std::vector<std::int64_t> pads = *spatial_pads(graph, pad);
             const auto own = conv.attr_ints("pads");
             for (std::size_t i = 0; i < own.size(); ++i) pads[i] += own[i];
             conv.attributes["pads"] = Attribute::of_ints(pads);
             conv.inputs[0] = pad.inputs[0];
             graph.erase(&pad);
             return true;
           }) > 0;
  }

 private:
  /// A Pad's amounts on the axes after the first two, in Conv's order (all begins, then all
  /// ends), when it pads with zeros, only there, and never crops.
  static std::optional<std::vector<std::int64_t>> spatial_pads(const Graph& g, const Node& n) {
    if (n.attr_string("mode", "constant") != "constant" || n.inputs.empty()) return std::nullopt;
    std::vector<std::int64_t> pads;
    if (g.default_opset() < 11) {
      pads = n.attr_ints("pads");
      if (n.attr_float("value", 0.0) != 0.0) return std::nullopt;
    } else {
      if (!n.has_input(1) || (n.inputs.size() > 3 && !n.inputs[3].empty())) return std::nullopt;  // no axes input
      auto t = constant(g, n.inputs[1]);
      if (!t || t->dim() != 1) return std::nullopt;
      const at::Tensor p = t->to(at::kLong).contiguous();
      pads.assign(p.data_ptr<std::int64_t>(), p.data_ptr<std::int64_t>() + p.numel());
      if (n.has_input(2)) {
        auto v = constant(g, n.inputs[2]);
        if (!v || v->numel() != 1 || v->to(at::kDouble).reshape({}).item<double>() != 0.0) return std::nullopt;
      }
    }
    const std::size_t rank = pads.size() / 2;
    if (pads.size() % 2 != 0 || rank < 3) return std::nullopt;
    for (auto v : pads)
      if (v < 0) return std::nullopt;
    if (pads[0] || pads[1] || pads[rank] || pads[rank + 1]) return std::nullopt;
    std::vector<std::int64_t> out(pads.begin() + 2, pads.begin() + static_cast<std::ptrdiff_t>(rank));
    out.insert(out.end(), pads.begin() + static_cast<std::ptrdiff_t>(rank) + 2, pads.end());
    return out;
  }
};

/// A scalar floating constant operand that broadcasts to nothing larger than x: rank 0, or
/// rank 1 when x comes from an op whose output has rank >= 2.
std::optional<double> activation_constant(const Graph& g, const std::string& name, const std::string& x) {
  auto t = constant(g, name);
  if (!t || t->numel() != 1 || !t->is_floating_point() || t->dim() > 1) return std::nullopt;
  if (t->dim() == 1) {
    static const std::set<std::string> ranked = {"Conv",    "ConvTranspose", "BatchNormalization",   "Gemm",
                                                 "MaxPool", "AveragePool",   "InstanceNormalization"};
    const Node* from = g.producer(x);
    if (!from || !ranked.count(from->op_type)) return std::nullopt;
  }
  return t->reshape({}).item<double>();
}

class FuseActivations final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    bool changed = fuse_leaky_relu(g);
    changed = fuse_constant_bounds(g) || changed;
    changed = merge_bounds(g) || changed;
    return changed;
  }

  // Max(x, Mul(x, a)) = x for x >= 0 and a * x below: LeakyRelu(alpha = a) for 0 <= a < 1.
  static bool fuse_leaky_relu(Graph& g) {
    Pattern p;
    p.node("mul", {"Mul"});
    p.node("max", {"Max"}, {"mul"}, Inputs::kAnyOrder,
           [](const Node& n, const Graph&) { return n.inputs.size() == 2; });
    p.joint([](const Match& m, const Graph& graph) {
      const Node &mul = *m.at("mul"), &max = *m.at("max");
      const std::string x = other_input(max, mul.outputs[0]);
      if (x.empty() || mul.inputs.size() != 2) return false;
      const std::string a = other_input(mul, x);
      if (a.empty()) return false;
      auto alpha = activation_constant(graph, a, x);
      return alpha && *alpha >= 0 && *alpha < 1;
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& max = *m.at("max");
             const Node& mul = *m.at("mul");
             const std::string x = other_input(max, mul.outputs[0]);
             const double alpha = *activation_constant(graph, other_input(mul, x), x);
             max.op_type = alpha == 0 ? "Relu" : "LeakyRelu";
             max.inputs = {x};
             max.attributes.clear();
             if (alpha != 0) max.attributes["alpha"] = Attribute::of_float(alpha);
             graph.erase(&mul);
             return true;
           }) > 0;
  }

  // Max(x, 0) is Relu; Max(x, c) and Min(x, c) are Clip with one bound.
  static bool fuse_constant_bounds(Graph& g) {
    Pattern p;
    p.node("op", {"Max", "Min"}, {}, Inputs::kOrdered, [](const Node& n, const Graph& graph) {
      if (n.inputs.size() != 2) return false;
      const bool c0 = bool(constant(graph, n.inputs[0])), c1 = bool(constant(graph, n.inputs[1]));
      return c0 != c1 && activation_constant(graph, c0 ? n.inputs[0] : n.inputs[1], c0 ? n.inputs[1] : n.inputs[0]);
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& n = *m.at("op");
             const bool first_constant = bool(constant(graph, n.inputs[0]));
             const std::string x = n.inputs[first_constant ? 1 : 0], c = n.inputs[first_constant ? 0 : 1];
             const double bound = *activation_constant(graph, c, x);
             const bool lower = n.op_type == "Max";
             if (lower && bound == 0) {
               n.op_type = "Relu";
               n.inputs = {x};
               return true;
             }
             return clip_with_bounds(graph, n, x, lower ? std::optional<double>(bound) : std::nullopt,
                                     lower ? std::nullopt : std::optional<double>(bound), c);
           }) > 0;
  }

  // Relu or Clip, then Clip: one Clip on the intersection of the two ranges (where they meet;
  // apart, the result would be a constant, left as is).
  static bool merge_bounds(Graph& g) {
    Pattern p;
    p.node("inner", {"Relu", "Clip"});
    p.node("outer", {"Clip"}, {"inner"});
    p.joint([](const Match& m, const Graph& graph) {
      auto a = clip_bounds(graph, *m.at("inner")), b = clip_bounds(graph, *m.at("outer"));
      if (!a || !b) return false;
      auto [lo, hi] = intersection(*a, *b);
      return !lo || !hi || *lo <= *hi;
    });
    return rewrite(g, p, [](Graph& graph, const Match& m) {
             Node& outer = *m.at("outer");
             const Node& inner = *m.at("inner");
             auto [lo, hi] = intersection(*clip_bounds(graph, inner), *clip_bounds(graph, outer));
             const std::string x = inner.inputs[0];
             std::string like;  // a bound constant of either Clip (opset >= 11): the type of the new ones
             for (const Node* n : {static_cast<const Node*>(&outer), &inner})
               for (std::size_t i = 1; i < n->inputs.size() && like.empty(); ++i) like = n->inputs[i];
             if (like.empty() && graph.default_opset() >= 11) return false;
             if (!clip_with_bounds(graph, outer, x, lo, hi, like)) return false;
             graph.erase(&inner);
             return true;
           }) > 0;
  }

  using Bounds = std::pair<std::optional<double>, std::optional<double>>;

  static Bounds intersection(const Bounds& a, const Bounds& b) {
    auto pick = [](const std::optional<double>& x, const std::optional<double>& y,
                   bool lower) -> std::optional<double> {
      if (!x) return y;
      if (!y) return x;
      return lower ? std::max(*x, *y) : std::min(*x, *y);
    };
    return {pick(a.first, b.first, true), pick(a.second, b.second, false)};
  }

  /// The (lower, upper) bounds of a Relu or of a Clip whose bounds are constant (unset: none).
  static std::optional<std::pair<std::optional<double>, std::optional<double>>> clip_bounds(const Graph& g,
                                                                                            const Node& n) {
    if (n.op_type == "Relu") return std::make_pair(std::optional<double>(0.0), std::optional<double>());
    std::pair<std::optional<double>, std::optional<double>> b;
    if (g.default_opset() < 11) {
      if (n.has_attr("min")) b.first = n.attr_float("min", 0);
      if (n.has_attr("max")) b.second = n.attr_float("max", 0);
      return b;
    }
    for (std::size_t i = 1; i < 3; ++i) {
      if (!n.has_input(i)) continue;
      auto t = constant(g, n.inputs[i]);
      if (!t || t->numel() != 1) return std::nullopt;
      (i == 1 ? b.first : b.second) = t->reshape({}).item<double>();
    }
    return b;
  }

  /// Turns `n` into Clip(x) with the given bounds: inputs at opset >= 11 (constants typed like
  /// `like`, a constant of x's type), attributes before.
  static bool clip_with_bounds(Graph& g, Node& n, const std::string& x, std::optional<double> lo,
                               std::optional<double> hi, const std::string& like) {
    const bool as_inputs = g.default_opset() >= 11;
    auto type_of = constant(g, like);
    if (as_inputs && !type_of) return false;
    n.op_type = "Clip";
    n.attributes.clear();
    if (!as_inputs) {
      n.inputs = {x};
      if (lo) n.attributes["min"] = Attribute::of_float(*lo);
      if (hi) n.attributes["max"] = Attribute::of_float(*hi);
      return true;
    }
    n.inputs = {x, "", ""};
    for (int i : {0, 1}) {
      const std::optional<double>& v = i == 0 ? lo : hi;
      if (!v) continue;
      const std::string name = g.unique_name(n.name + (i == 0 ? "_min" : "_max"));
      g.initializers[name] = at::full({}, *v, type_of->options());
      n.inputs[static_cast<std::size_t>(i) + 1] = name;
    }
    while (n.inputs.size() > 1 && n.inputs.back().empty()) n.inputs.pop_back();
    return true;
  }
};

class MoveTransposes final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext&) override {
    // One input, each element on its own: the same result in any layout.
    static const std::set<std::string> elementwise = {
        "Relu", "LeakyRelu", "Clip",     "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu",
        "Gelu", "Softplus",  "Softsign", "Mish",    "Abs",         "Neg",       "Exp",  "Log", "Sqrt", "Erf"};
    Pattern p;
    p.node("t", {"Transpose"});
    p.node("act", std::vector<std::string>(elementwise.begin(), elementwise.end()), {"t"}, Inputs::kOrdered,
           [](const Node& n, const Graph& graph) {
             if (!n.domain.empty() || n.outputs.size() != 1) return false;
             for (std::size_t i = 1; i < n.inputs.size(); ++i)  // Clip's bounds: scalars by definition
               if (!n.inputs[i].empty() && !constant(graph, n.inputs[i])) return false;
             return true;
           });
    const bool moved = rewrite(g, p, [](Graph& graph, const Match& m) {
                         Node& t = *m.at("t");
                         Node act = *m.at("act");
                         const std::string out = act.outputs[0];
                         act.inputs[0] = t.inputs[0];
                         act.outputs[0] = graph.unique_name(out + "_untransposed");
                         graph.erase(m.at("act"));
                         t.inputs[0] = act.outputs[0];
                         t.outputs[0] = out;
                         graph.insert_before(&t, std::move(act));
                         return true;
                       }) > 0;
    // Activations that a Transpose kept apart may now be one Clip.
    return (moved && FuseActivations::merge_bounds(g)) || moved;
  }
};

void register_all(Registrar& r) {
  r.add_pass<RemoveIdentity>("remove_identity");
  r.add_pass<FoldConstants>("fold_constants");
  r.add_pass<FuseBatchNorm>("fuse_bn");
  r.add_pass<FuseAffine>("fuse_affine");
  r.add_pass<FuseMatMulAdd>("fuse_matmul_add");
  r.add_pass<FuseHardSigmoid>("fuse_hardsigmoid");
  r.add_pass<FuseHardSwish>("fuse_hardswish");
  r.add_pass<FuseGelu>("fuse_gelu");
  r.add_pass<FuseLayerNorm>("fuse_layernorm");
  r.add_pass<FusePad>("fuse_pad");
  r.add_pass<FuseActivations>("fuse_activations");
  r.add_pass<MoveTransposes>("move_transposes");
}

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.simplify", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
