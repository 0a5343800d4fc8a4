// smooth_quant (simplify stage, off by default): for every activation X read by MatMul / Gemm
// (or a 1x1 Conv) with a constant weight W, divides input channel j of X by
//     s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)
// and multiplies row j of W by s_j, so X W is unchanged while the outlier channels that make a
// per-tensor activation grid coarse move into the weights, which are quantized per channel
// (Xiao et al., "SmoothQuant", 2023; alpha is option `alpha`, default 0.5). max|X_j| comes from
// the calibration data (PassContext::channel_absmax). Consumers that read the same X share one
// s (the largest weight range over them). 1/s is folded into what produced X where X has no
// other reader: LayerNormalization (or its opset-11 form, Mul by gamma then Add beta) or
// BatchNormalization (scale and bias), or a Conv / Gemm / MatMul with constant weights (output
// channels, and bias); elsewhere a Mul by 1/s is inserted
// in front of the smoothed consumers, which keeps the function for any producer.
//
// With option `depthwise = true`, depthwise convolutions (group = input channels, one filter
// each) take part too: filter j absorbs s_j, which per-channel weights take at no cost. This is the case per-tensor
// activations handle worst in mobile networks: after a BatchNorm fold and hard-swish the
// channels feeding a depthwise convolution can differ in range fifty-fold, and the convolution
// never mixes them, so the quiet channels are left a few levels of the grid. alpha = 1 would
// bring every channel to one range, but also take away the headroom the quiet channels had
// for values beyond the calibration maximum; on the OCR detector 0.5 did better. Off by
// default: it helps the OCR detector much (worst-page cosine 0.67 -> 0.91) and costs the OCR
// recognizer 1.6 points of exact-match (ACCURACY.md).

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <set>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

/// A consumer whose weight rows (input channels) can absorb s.
struct Consumer {
  Node* node;
  std::int64_t weight_axis;  // the weight's input-channel axis
};

bool constant(const Graph& g, const Node& n, std::size_t i) {
  return n.has_input(i) && g.initializers.count(n.inputs[i]) && g.initializers.at(n.inputs[i]).is_floating_point();
}

/// The axis of X that holds the channels and of W that takes s, if `n` can be smoothed.
std::optional<std::pair<std::int64_t, Consumer>> smoothable(Graph& g, Node& n, bool depthwise) {
  if (!n.domain.empty() || !n.has_input(0) || g.initializers.count(n.inputs[0])) return std::nullopt;
  if (n.op_type == "MatMul" && constant(g, n, 1) && g.initializers.at(n.inputs[1]).dim() == 2)
    return std::make_pair(std::int64_t{-1}, Consumer{&n, 0});
  if (n.op_type == "Gemm" && constant(g, n, 1) && n.attr_int("transA", 0) == 0)
    return std::make_pair(std::int64_t{-1}, Consumer{&n, n.attr_int("transB", 0) ? 1 : 0});
  if (n.op_type == "Conv" && constant(g, n, 1)) {
    const at::Tensor& w = g.initializers.at(n.inputs[1]);
    const std::int64_t group = n.attr_int("group", 1);
    if (group == 1) {
      bool pointwise = w.dim() >= 3;
      for (std::int64_t d = 2; d < w.dim(); ++d) pointwise = pointwise && w.size(d) == 1;
      if (pointwise) return std::make_pair(std::int64_t{1}, Consumer{&n, 1});
    } else if (depthwise && w.dim() >= 3 && w.size(1) == 1 && w.size(0) == group) {  // multiplier 1
      return std::make_pair(std::int64_t{1}, Consumer{&n, 0});
    }
  }
  return std::nullopt;
}

/// Largest |w| per index of `axis`.
at::Tensor range_along(const at::Tensor& w, std::int64_t axis) {
  return w.detach().abs().transpose(0, axis).reshape({w.size(axis), -1}).amax(1).to(at::kDouble);
}

/// Multiplies `axis` of constant input `i` of `n` by `s` (a fresh initializer: others may share it).
void scale_constant(Graph& g, Node& n, std::size_t i, std::int64_t axis, const at::Tensor& s) {
  const at::Tensor& w = g.initializers.at(n.inputs[i]);
  std::vector<std::int64_t> shape(static_cast<std::size_t>(w.dim()), 1);
  shape[static_cast<std::size_t>(axis)] = s.numel();
  const std::string name = g.unique_name(n.inputs[i] + "_smoothed");
  g.initializers[name] = (w.to(at::kDouble) * s.reshape(shape)).to(w.scalar_type()).contiguous();
  n.inputs[i] = name;
}

/// Folds 1/s into the producer of X when X's channels are its output channels; false otherwise.
bool fold_into_producer(Graph& g, Node* p, std::int64_t x_axis, const at::Tensor& inv) {
  if (!p || !p->domain.empty()) return false;
  const std::int64_t k = inv.numel();
  auto vector_of = [&](std::size_t i) {
    return constant(g, *p, i) && g.initializers.at(p->inputs[i]).dim() == 1 &&
           g.initializers.at(p->inputs[i]).numel() == k;
  };
  if (p->op_type == "LayerNormalization" && x_axis == -1 && p->attr_int("axis", -1) == -1 && vector_of(1) &&
      (!p->has_input(2) || vector_of(2))) {
    scale_constant(g, *p, 1, 0, inv);
    if (p->has_input(2)) scale_constant(g, *p, 2, 0, inv);
    return true;
  }
  if (p->op_type == "BatchNormalization" && x_axis == 1 && vector_of(1) && vector_of(2) && p->outputs.size() == 1) {
    scale_constant(g, *p, 1, 0, inv);
    scale_constant(g, *p, 2, 0, inv);
    return true;
  }
  // LayerNorm as opset-11 exporters write it: ... Mul(normalized, gamma) -> Add(., beta), with
  // the Mul read by the Add alone.
  if (p->op_type == "Add" && x_axis == -1 && p->inputs.size() == 2) {
    for (std::size_t c = 0; c < 2; ++c) {
      Node* mul = g.producer(p->inputs[1 - c]);
      if (!vector_of(c) || !mul || mul->op_type != "Mul" || !mul->domain.empty() ||
          g.consumers(mul->outputs[0]).size() != 1 || g.is_graph_output(mul->outputs[0]))
        continue;
      for (std::size_t m = 0; m < 2; ++m) {
        if (!constant(g, *mul, m) || g.initializers.at(mul->inputs[m]).dim() != 1 ||
            g.initializers.at(mul->inputs[m]).numel() != k)
          continue;
        scale_constant(g, *mul, m, 0, inv);
        scale_constant(g, *p, c, 0, inv);
        return true;
      }
    }
  }
  // Weighted producers: their output channel axis of the weight, and the bias input.
  std::int64_t out_axis = -1;
  if (p->op_type == "Conv" && x_axis == 1 && constant(g, *p, 1)) out_axis = 0;
  if (p->op_type == "MatMul" && x_axis == -1 && constant(g, *p, 1) && g.initializers.at(p->inputs[1]).dim() == 2)
    out_axis = 1;
  if (p->op_type == "Gemm" && x_axis == -1 && constant(g, *p, 1)) out_axis = p->attr_int("transB", 0) ? 0 : 1;
  if (out_axis < 0 || g.initializers.at(p->inputs[1]).size(out_axis) != k) return false;
  const bool has_bias = p->op_type != "MatMul" && p->has_input(2);
  if (has_bias && !vector_of(2)) return false;  // a broadcast Gemm bias: leave it to the Mul
  scale_constant(g, *p, 1, out_axis, inv);
  if (has_bias) scale_constant(g, *p, 2, 0, inv);
  return true;
}

class SmoothQuant final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext& ctx) override {
    const double alpha = ctx.options.get_double("alpha", 0.5);
    if (!(alpha >= 0 && alpha <= 1)) throw Error("option alpha must be between 0 and 1");
    const bool depthwise = ctx.options.get_bool("depthwise", false);
    // X -> its smoothable consumers, in graph order (one channel axis per X).
    std::map<std::string, std::pair<std::int64_t, std::vector<Consumer>>> groups;
    std::set<std::string> mixed;  // read along two axes: no single s fits
    for (Node* n : g.nodes()) {
      auto s = smoothable(g, *n, depthwise);
      if (!s) continue;
      auto [it, fresh] = groups.try_emplace(n->inputs[0], s->first, std::vector<Consumer>{});
      if (!fresh && it->second.first != s->first) mixed.insert(n->inputs[0]);
      it->second.second.push_back(s->second);
    }
    for (const auto& x : mixed) groups.erase(x);
    std::vector<PassContext::ChannelRequest> requests;
    std::vector<std::string> values;
    for (const auto& [x, group] : groups)
      if (!group.second.empty()) requests.push_back({x, group.first}), values.push_back(x);
    if (requests.empty()) return false;
    if (!ctx.channel_absmax)
      throw Error(
          "needs calibration data for the activation ranges: run it within quantize, qat or prune with --calib");
    const std::vector<at::Tensor> ranges = ctx.channel_absmax(requests);
    bool changed = false;
    for (std::size_t r = 0; r < values.size(); ++r) {
      const std::string& x = values[r];
      const auto& [axis, consumers] = groups.at(x);
      if (!ranges.at(r).defined()) continue;
      const at::Tensor ax = ranges[r].to(at::kDouble);
      at::Tensor aw;
      bool fits = true;
      for (const Consumer& c : consumers) {
        const at::Tensor& w = g.initializers.at(c.node->inputs[1]);
        if (w.size(c.weight_axis) != ax.numel()) fits = false;
        if (!fits) break;
        const at::Tensor rw = range_along(w, c.weight_axis);
        aw = aw.defined() ? at::maximum(aw, rw) : rw;
      }
      if (!fits) continue;
      // Dead channels on either side keep s = 1; s is bounded so no channel is scaled to nothing.
      const at::Tensor live = (ax > 0) & (aw > 0);
      at::Tensor s =
          at::where(live, ax.pow(alpha) / at::where(live, aw, at::ones_like(aw)).pow(1 - alpha), at::ones_like(ax));
      s = s.clamp(1e-5, 1e5);
      if ((s - 1).abs().max().item<double>() < 1e-6) continue;
      const at::Tensor inv = 1.0 / s;
      // Folding changes X for every reader: only when the smoothed consumers are all of them.
      const auto readers = g.consumers(x);
      const bool only_smoothed = !g.is_graph_output(x) && readers.size() == consumers.size();
      if (!(only_smoothed && fold_into_producer(g, g.producer(x), axis, inv))) {
        Node mul;
        mul.op_type = "Mul";
        mul.name = g.unique_name(x + "_smooth_quant");
        const std::string factor = g.unique_name(x + "_smooth_factor");
        std::vector<std::int64_t> shape{inv.numel()};
        if (axis == 1) {  // channels first: [C, 1, ...] against X of the weight's rank
          const std::int64_t rank = g.initializers.at(consumers[0].node->inputs[1]).dim();
          for (std::int64_t d = 2; d < rank; ++d) shape.push_back(1);
        }
        g.initializers[factor] = inv.to(at::kFloat).reshape(shape).contiguous();
        const std::string smoothed = g.unique_name(x + "_smoothed");
        mul.inputs = {x, factor};
        mul.outputs = {smoothed};
        g.insert_before(consumers[0].node, std::move(mul));  // the first reader in graph order
        for (const Consumer& c : consumers) c.node->inputs[0] = smoothed;
      }
      for (const Consumer& c : consumers) scale_constant(g, *c.node, 1, c.weight_axis, s);
      changed = true;
    }
    return changed;
  }
};

void register_all(Registrar& r) { r.add_pass<SmoothQuant>("smooth_quant"); }

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.smooth_quant", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
