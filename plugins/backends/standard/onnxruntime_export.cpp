// Note [ONNX Runtime channel padding]
// ONNX Runtime's QLinearConv runs a convolution of one group on MLAS's symmetric indirect-conv
// kernels (MlasConvSym; onnxruntime/core/mlas/lib/convsym.cpp, MlasConvSymPackWSize, and
// qlinearconv.cc, TryConvSymPrepack) only where its weights are int8 with zero point 0, its
// input's zero point is a constant, its input channels are a multiple of 4 and its output
// channels a multiple of 8 (at least 16). Any other convolution goes through im2col and a
// general integer GEMM, which on the shallow first layer of an image model (3 channels of RGB,
// 1 of grayscale) runs slower than the float convolution: MobileNetV2's first layer took 1.46 ms
// as QLinearConv against 0.70 ms in float (ONNX Runtime 1.30, one thread, Xeon with VNNI).
// The export pads the input of such a convolution of 1 to 3 channels to 4: a Pad of its 8-bit
// input with the zero point (exactly 0 once dequantized) and zero weights for the new channels.
// The result is the same to the bit and the layer takes the fast kernel: 0.53 ms there, the Pad
// 0.03 ms; a grayscale CNN's first layer gains too, though it computes 4 times the products.
// Deeper layers are left alone: the general GEMM does well enough with 20 or more channels that
// a Pad's pass over the input costs more than it saves (PP-OCR cls's 1x1 convolutions of 22 to
// 50 channels: 2-3 us saved each, 8-11 us for the Pad). Only where ONNX Runtime's selector makes
// a QLinearConv of the Conv (uint8 input, DequantizeLinear on input and weight) and the padded
// layer then qualifies; the latency step times the whole export as usual (Note [Latency step]).

#include <ATen/ATen.h>

#include "onnxruntime_placement.h"

namespace sparsebit::backends {
namespace {

bool is_op(const Node* n, const char* op) { return n != nullptr && n->domain.empty() && n->op_type == op; }

/// The initializer `name`, or an undefined tensor.
at::Tensor initializer(const Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  return it == g.initializers.end() ? at::Tensor() : it->second;
}

/// A DequantizeLinear of one grid per tensor or per channel (not per block).
bool plain_dequantize(const Node* dq) { return is_op(dq, "DequantizeLinear") && !dq->has_attr("block_size"); }

void pad_input_channels(Graph& g, Node& conv) {
  Node* dqx = g.producer(conv.inputs[0]);
  Node* dqw = conv.inputs.size() > 1 ? g.producer(conv.inputs[1]) : nullptr;
  if (!plain_dequantize(dqx) || !plain_dequantize(dqw) || conv.attr_int("group", 1) != 1) return;
  const at::Tensor w = initializer(g, dqw->inputs[0]);
  if (!w.defined() || w.scalar_type() != at::kChar || w.dim() < 3 || g.narrow_types.count(dqw->inputs[0]) != 0) return;
  if (dqw->has_input(2)) {
    const at::Tensor wz = initializer(g, dqw->inputs[2]);
    if (!wz.defined() || wz.count_nonzero().item<std::int64_t>() != 0) return;
  }
  if (dqw->attr_int("axis", 1) != 0 && initializer(g, dqw->inputs[1]).numel() != 1) return;
  // The input: uint8 (ONNX Runtime's x86 kernels take int8 inputs only after turning a Q -> DQ
  // pair into uint8, which a Pad between them would stop), one constant grid.
  if (!dqx->has_input(2)) return;
  const at::Tensor xs = initializer(g, dqx->inputs[1]), xz = initializer(g, dqx->inputs[2]);
  if (!xs.defined() || !xz.defined() || xs.numel() != 1 || xz.numel() != 1 || xz.scalar_type() != at::kByte) return;
  const std::int64_t in = w.size(1), out = w.size(0), padded = 4;
  if (in >= padded || out < 16 || out % 8 != 0) return;

  const std::vector<std::int64_t> pad_shape = [&] {
    std::vector<std::int64_t> p(2 * w.dim(), 0);
    p[w.dim() + 1] = padded - in;  // the end of axis 1
    return p;
  }();
  const std::string base = conv.name.empty() ? conv.outputs[0] : conv.name;
  const std::string pads = g.unique_name(base + "_channel_pads");
  g.initializers[pads] = at::tensor(pad_shape, at::kLong);
  Node pad;
  pad.op_type = "Pad";
  pad.name = g.unique_name(base + "_channel_pad");
  std::string fill = dqx->inputs[2];
  if (xz.dim() != 0) {  // Pad's constant_value is a scalar
    fill = g.unique_name(base + "_channel_pad_value");
    g.initializers[fill] = xz.reshape({});
  }
  pad.inputs = {dqx->inputs[0], pads, fill};
  pad.outputs = {g.unique_name(dqx->inputs[0] + "_channel_padded")};
  Node new_dqx = *dqx;
  new_dqx.name = g.unique_name(dqx->name + "_channel_padded");
  new_dqx.inputs[0] = pad.outputs[0];
  new_dqx.outputs = {g.unique_name(dqx->outputs[0] + "_channel_padded")};

  std::vector<std::int64_t> w_shape = w.sizes().vec();
  w_shape[1] = padded;
  at::Tensor wp = at::zeros(w_shape, w.options());
  wp.narrow(1, 0, in).copy_(w);
  const std::string w_name = g.unique_name(dqw->inputs[0] + "_channel_padded");
  g.initializers[w_name] = wp;
  Node new_dqw = *dqw;
  new_dqw.name = g.unique_name(dqw->name + "_channel_padded");
  new_dqw.inputs[0] = w_name;
  new_dqw.outputs = {g.unique_name(dqw->outputs[0] + "_channel_padded")};

  const std::string old_x = conv.inputs[0], old_w = conv.inputs[1], old_w_init = dqw->inputs[0];
  conv.inputs[0] = new_dqx.outputs[0];
  conv.inputs[1] = new_dqw.outputs[0];
  g.insert_before(&conv, std::move(pad));
  g.insert_before(&conv, std::move(new_dqx));
  g.insert_before(&conv, std::move(new_dqw));
  // What only this convolution read goes.
  for (const std::string& v : {old_x, old_w})
    if (g.consumers(v).empty() && !g.is_graph_output(v)) g.erase(g.producer(v));
  if (g.consumers(old_w_init).empty()) g.initializers.erase(old_w_init);
}

}  // namespace

void pad_convolutions_for_onnxruntime(Graph& graph) {
  if (graph.default_opset() < 11) return;  // Pad takes its pads as an input from opset 11
  std::vector<Node*> convs;                // first: padding erases the DequantizeLinear nodes it replaces
  for (Node* n : graph.nodes())
    if (is_op(n, "Conv") && n->inputs.size() >= 2) convs.push_back(n);
  for (Node* conv : convs) pad_input_channels(graph, *conv);
}

}  // namespace sparsebit::backends
