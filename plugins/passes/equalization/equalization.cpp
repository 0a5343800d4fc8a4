// cross_layer_equalization (simplify stage): for two convolutions in a row, Conv1 -> [ReLU or
// LeakyRelu] -> Conv2, scales output channel i of Conv1 by 1/s_i and input channel i of Conv2 by
// s_i with s_i = sqrt(r1_i / r2_i), where r1_i and r2_i are the largest weight magnitudes of that
// channel in each layer. Both ranges become sqrt(r1_i * r2_i), so a per-tensor weight grid no
// longer wastes its levels on one dominant channel; the float function is unchanged because
// ReLU and LeakyRelu commute with positive scaling (Nagel et al., "Data-Free Quantization
// Through Weight Equalization and Bias Correction", 2019). Depthwise and grouped convolutions
// on either side are handled; chains of more than two convolutions converge over `iterations`
// rounds (option, default 8).

#include <ATen/ATen.h>

#include <cmath>

#include "sparsebit/sdk/pattern.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

bool constant_weight(const Node& n, const Graph& g) {
  if (!n.has_input(1) || !g.initializers.count(n.inputs[1]) || g.initializers.at(n.inputs[1]).dim() < 3) return false;
  return !n.has_input(2) || g.initializers.count(n.inputs[2]);
}

class CrossLayerEqualization final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }
  bool run(Graph& g, const PassContext& ctx) override {
    const std::int64_t iterations = ctx.options.get_int("iterations", 8);
    if (iterations < 1 || iterations > 1000)  // each sweep rescales every pair; 8 converge
      throw Error(ctx.options.where() + ": iterations must be 1 to 1000, got " + std::to_string(iterations));
    Pattern with_act, direct;
    for (Pattern* p : {&with_act, &direct}) {
      p->node("conv1", {"Conv"}, {}, Pattern::Inputs::kOrdered, constant_weight);
      if (p == &with_act) p->node("act", {"Relu", "LeakyRelu"}, {"conv1"});
      p->node("conv2", {"Conv"}, {p == &with_act ? "act" : "conv1"}, Pattern::Inputs::kOrdered, constant_weight);
    }
    bool changed = false;
    for (std::int64_t it = 0; it < iterations; ++it) {
      bool moved = false;
      for (Pattern* p : {&with_act, &direct})
        for (const Match& m : p->find(g)) moved = equalize(g, *m.at("conv1"), *m.at("conv2")) || moved;
      changed = changed || moved;
      if (!moved) break;
    }
    return changed;
  }

 private:
  /// Rescales one pair; false when the shapes do not line up or nothing would move.
  static bool equalize(Graph& g, Node& conv1, Node& conv2) {
    at::Tensor w1 = g.initializers.at(conv1.inputs[1]).to(at::kDouble);
    at::Tensor w2 = g.initializers.at(conv2.inputs[1]).to(at::kDouble);
    const std::int64_t channels = w1.size(0), groups = conv2.attr_int("group", 1);
    if (groups < 1 || channels % groups || w2.size(1) * groups != channels || w2.size(0) % groups) return false;
    // conv2's weight seen as [groups, out/groups, in/groups, k...]: input channel i is
    // (i / (in/groups), :, i % (in/groups)).
    std::vector<std::int64_t> grouped{groups, w2.size(0) / groups, w2.size(1)};
    std::vector<std::int64_t> scale_shape{groups, 1, w2.size(1)}, reduce{1};
    for (std::int64_t d = 2; d < w2.dim(); ++d) {
      grouped.push_back(w2.size(d));
      scale_shape.push_back(1);
      reduce.push_back(d + 1);
    }
    at::Tensor w2g = w2.reshape(grouped);
    const at::Tensor r2 = w2g.abs().amax(reduce).reshape({channels});
    std::vector<std::int64_t> rest;
    for (std::int64_t d = 1; d < w1.dim(); ++d) rest.push_back(d);
    const at::Tensor r1 = w1.abs().amax(rest);
    // Dead channels (a zero range on either side) keep scale 1.
    const at::Tensor live = (r1 > 0) & (r2 > 0);
    const at::Tensor s = at::where(live, at::sqrt(r1 / at::where(live, r2, at::ones_like(r2))), at::ones_like(r1));
    if ((s - 1).abs().max().item<double>() < 1e-6) return false;
    std::vector<std::int64_t> s1_shape(static_cast<std::size_t>(w1.dim()), 1);
    s1_shape[0] = channels;
    const auto dtype = g.initializers.at(conv1.inputs[1]).scalar_type();
    auto store = [&](Node& n, std::size_t input, const at::Tensor& value) {
      // A fresh initializer: the old one may be shared with other nodes.
      const std::string name = g.unique_name(n.inputs[input] + "_equalized");
      g.initializers[name] = value.to(dtype).contiguous();
      n.inputs[input] = name;
    };
    store(conv1, 1, w1 / s.reshape(s1_shape));
    if (conv1.has_input(2)) store(conv1, 2, g.initializers.at(conv1.inputs[2]).to(at::kDouble) / s);
    store(conv2, 1, (w2g * s.reshape(scale_shape)).reshape(w2.sizes()));
    g.prune_dead();
    return true;
  }
};

void register_all(Registrar& r) {
  r.add_pass<CrossLayerEqualization>("cross_layer_equalization", PassSchedule{1400, false});
}

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.equalization", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
