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
// (fuse_bn and fuse_affine in simplify_folds.cpp; fuse_matmul_add to fuse_pad in
// simplify_fusions.cpp; fuse_activations and move_transposes in simplify_activations.cpp)

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "simplify_common.h"
#include "sparsebit/sdk/batchnorm.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/pattern.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes::simplify {
namespace {

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

}  // namespace

void register_all(Registrar& r) {
  r.add_pass<RemoveIdentity>("remove_identity", PassSchedule{100, true});
  r.add_pass<FoldConstants>("fold_constants", PassSchedule{200, true});
  register_folds(r);
  register_fusions(r);
  register_activations(r);
}

}  // namespace sparsebit::passes::simplify

SPARSEBIT_PLUGIN("sparsebit.passes.simplify", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::simplify::register_all)
