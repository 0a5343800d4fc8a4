// Simplify passes that fold a per-channel affine map into the layer before it: fuse_bn
// (BatchNormalization) and fuse_affine (Mul, Add, Sub, Div by constants).

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

}  // namespace

void register_folds(Registrar& r) {
  r.add_pass<FuseBatchNorm>("fuse_bn", PassSchedule{400, true});
  // Folding the arithmetic around convolutions serves ONNX Runtime's integer kernels (and its
  // accuracy); under TensorRT's symmetric activations it cost the PP-OCRv4 recognizer 12 points
  // (docs/PASSES.md). So it is on by default for that backend only; [schedule] sets it either way.
  r.add_pass<FuseAffine>("fuse_affine", PassSchedule{500, true, {"onnxruntime"}});
}

}  // namespace sparsebit::passes::simplify
