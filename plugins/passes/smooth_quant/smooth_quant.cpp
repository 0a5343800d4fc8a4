// smooth_quant (simplify stage, off by default): for every activation X read by MatMul / Gemm
// (or a 1x1 Conv) with a constant weight W, divides input channel j of X by
//     s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)
// and multiplies row j of W by s_j, so X W is unchanged while the outlier channels that make a
// per-tensor activation grid coarse move into the weights, which are quantized per channel
// (Xiao et al., "SmoothQuant", 2023; alpha is option `alpha`, default 0.5). max|X_j| comes from
// the calibration data (PassContext::channel_absmax). Consumers that read the same X share one
// s (the largest weight range over them). 1/s is folded into what produced X where X has no
// other reader (channel_scaling.h: LayerNormalization, RMSNorm's Mul by gamma, BatchNormalization,
// a Conv / Gemm / MatMul with constant weights, one factor of a gated product); elsewhere a Mul
// by 1/s is inserted in front of the smoothed consumers, which keeps the function for any producer.
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
#include <set>

#include "channel_scaling.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

using Consumer = ScaledReader;

/// Largest |w| per index of `axis`.
at::Tensor range_along(const at::Tensor& w, std::int64_t axis) {
  return w.detach().abs().transpose(0, axis).reshape({w.size(axis), -1}).amax(1).to(at::kDouble);
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
      auto s = scalable_reader(g, *n, true, depthwise);
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
      scale_channels(g, x, axis, consumers, s, "smooth_quant");
      changed = true;
    }
    return changed;
  }
};

void register_all(Registrar& r) { r.add_pass<SmoothQuant>("smooth_quant", PassSchedule{1500, false}); }

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.smooth_quant", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
