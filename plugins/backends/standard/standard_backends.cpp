// The deployment targets shipped with Sparsebit. Their rules are checked when the config is
// loaded, so an undeployable scheme fails in seconds, not at engine build time.
//   virtual      simulation only: any bit width from 2 to 16, any scheme
//   onnxruntime  W8A8 (QuantizeLinear/DequantizeLinear with int8/uint8), any scheme, placed where ONNX
//                Runtime's QDQ fusions make integer kernels of it and only where that pays
//                (Note [ONNX Runtime placement] in onnxruntime_placement.cpp); weights may
//                take ONNX Runtime's reduce range (a 7-bit grid in int8, [w] reduce_range = true).
//                Activations may also take 16 bits (int16/uint16 Q/DQ at opset 21, which ONNX
//                Runtime runs as dequantize -> float op -> quantize): the accuracy target's
//                "int16" fallback for sensitive layers. Recurrent layers stay float: ONNX
//                Runtime has no QDQ recurrent kernel (DequantizeLinear -> LSTM runs in float, and
//                its own static quantizer leaves them alone), so rounding their inputs would cost
//                accuracy for no speed; on a streaming detector the rounded state drifts.
//   tensorrt     W8A8; weights symmetric (per channel or per tensor), activations per-tensor
//                symmetric: TensorRT only accepts a zero point of 0. Placement: of a residual
//                Add only the skip branch is quantized, so TensorRT can fuse the Add into the
//                convolution that produces the other branch and run the block in INT8.
//                Recurrent layers (LSTM, GRU, RNN) stay float: TensorRT has no INT8 recurrent
//                kernel, and its ONNX parser slices their weights gate by gate from the
//                initializers, not from a DequantizeLinear output.
//                FP8 (type = "fp8_e4m3", Hopper and later): activations per tensor, weights per
//                tensor or per channel, zero point 0, at opset 19. TensorRT runs FP8 in the
//                matrix products and convolutions only (Conv, Gemm, MatMul, attention's batched
//                MatMuls among them), so a float8 input of any other op stays float: a Q/DQ
//                pair there would only round the tensor, not speed anything up. Under mixed
//                FP8/INT8 ([[specific]]) the INT8 layers keep the INT8 placement above.
//   virtual and tensorrt deploy float8 tables (DeploysFloat8); onnxruntime does not (its CPU
//                kernels have no FP8 arithmetic: the Q/DQ would run as float).

#include <map>
#include <set>

#include "onnxruntime_placement.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::backends {
namespace {

/// Input, input weights and recurrent weights of LSTM, GRU and RNN left in float, in `g` and in
/// its control-flow bodies.
void keep_recurrent_float(QuantState& state, const Graph& g) {
  static const std::set<std::string> recurrent = {"LSTM", "GRU", "RNN"};
  for (const Node* n : g.nodes()) {
    if (n->domain.empty() && recurrent.count(n->op_type) != 0)
      for (std::size_t i = 0; i < 3 && i < n->inputs.size(); ++i) state.set_fake_fused(*n, i, true);
    for (const Graph* body : n->subgraphs()) keep_recurrent_float(state, *body);
  }
}

std::optional<std::string> need_8_bits(const QSpec& s, const std::string& table) {
  if (s.reduce_range && s.bits == 7) return std::nullopt;  // 7-bit grid in int8/uint8 storage
  if (s.bits != 8)
    return table + ".bits = " + std::to_string(s.bits) +
           ", this backend runs 8-bit only (set bits = 8 or use backend = \"virtual\")";
  return std::nullopt;
}

/// Float8 rules shared by the backends that deploy it.
std::optional<std::string> float8_rules(const QSpec& s, const std::string& table, bool per_tensor_activations) {
  if (s.group_size > 0) return table + ".qscheme: float8 takes per-tensor or per-channel scales";
  if (per_tensor_activations && !s.is_weight && s.per_channel)
    return table + ".qscheme = \"" + s.qscheme() + "\": FP8 activations take one scale (use per-tensor-symmetric)";
  return std::nullopt;
}

class VirtualBackend final : public Backend, public DeploysFloat8 {
 public:
  std::string description() const override { return "simulation only: any bits 2-16, any scheme; fp8_e4m3 / fp8_e5m2"; }
  std::optional<std::string> check_float8(const QSpec& s, const std::string& table) const override {
    return float8_rules(s, table, false);
  }
  std::optional<std::string> check(const QSpec& s, const std::string& table) const override {
    if (s.is_weight && s.bits > 8) return table + ".bits = " + std::to_string(s.bits) + ": weights take 2 to 8 bits";
    return std::nullopt;
  }
  bool checks_u8s8_saturation() const override { return true; }
};

class OnnxRuntimeBackend final : public Backend {
 public:
  std::string description() const override { return "ONNX Runtime QDQ: W8A8 (or 16-bit activations), any scheme"; }
  std::optional<std::string> check(const QSpec& s, const std::string& table) const override {
    if (!s.is_weight && s.bits == 16) return std::nullopt;
    return need_8_bits(s, table);
  }
  // QLinearConv / QGemm add an int32 bias: simulate and export exactly that.
  bool quantize_bias() const override { return true; }
  bool checks_u8s8_saturation() const override { return true; }
  void place(QuantState& state) const override {
    keep_recurrent_float(state, state.graph());
    place_for_onnxruntime(state);  // Note [ONNX Runtime placement]
  }
  void adjust_export(Graph& graph) const override {
    pad_convolutions_for_onnxruntime(graph);  // Note [ONNX Runtime channel padding]
  }
};

class TensorRTBackend final : public Backend, public DeploysFloat8 {
 public:
  std::string description() const override {
    return "TensorRT explicit quantization: W8A8 or FP8, symmetric weights, per-tensor symmetric activations";
  }
  std::optional<std::string> check_float8(const QSpec& s, const std::string& table) const override {
    return float8_rules(s, table, true);
  }
  std::optional<std::string> check(const QSpec& s, const std::string& table) const override {
    if (s.reduce_range)
      return table +
             ".reduce_range: TensorRT's INT8 kernels accumulate in 32 bits on the GPU, a 7-bit grid only costs "
             "accuracy there (reduce_range is for ONNX Runtime on x86 processors without VNNI)";
    if (auto e = need_8_bits(s, table)) return e;
    if (!s.symmetric)
      return table + ".qscheme = \"" + s.qscheme() + "\": TensorRT needs a zero point of 0 (use a symmetric scheme)";
    if (!s.is_weight && s.per_channel)
      return table + ".qscheme = \"" + s.qscheme() +
             "\": TensorRT quantizes activations per tensor (use per-tensor-symmetric)";
    if (s.group_size > 0)
      return table +
             ".qscheme: per-group INT8 weights are not a TensorRT explicit-quantization mode (use "
             "per-channel-symmetric)";
    return std::nullopt;
  }

  static bool is_control_flow(const Node& n) {
    return n.domain.empty() &&
           (n.op_type == "If" || n.op_type == "Loop" || n.op_type == "Scan" || n.op_type == "SequenceMap");
  }
  static void keep_float(QuantState& state, const Graph& body) {
    for (const Node* n : body.nodes()) {
      for (std::size_t i = 0; i < n->inputs.size(); ++i) state.set_fake_fused(*n, i, true);
      if (is_control_flow(*n))
        for (const Graph* inner : n->subgraphs()) keep_float(state, *inner);
    }
  }

  void place(QuantState& state) const override {
    static const std::set<std::string> fusable = {"Conv", "ConvTranspose", "Gemm", "MatMul"};
    const Graph& g = state.graph();
    std::map<std::string, const Node*> producer;
    for (const Node* n : g.nodes())
      for (const auto& o : n->outputs) producer[o] = n;
    auto from_fusable = [&](const std::string& value) {
      auto it = producer.find(value);
      return it != producer.end() && it->second->domain.empty() && fusable.count(it->second->op_type) != 0;
    };
    keep_recurrent_float(state, g);
    // Bodies of If/Loop/Scan stay float: the parser builds them as conditional and loop layers,
    // and INT8 Q/DQ fusion inside those is not part of TensorRT's documented explicit quantization.
    for (const Node* n : g.nodes())
      if (is_control_flow(*n))
        for (const Graph* body : n->subgraphs()) keep_float(state, *body);
    for (const Node* n : g.nodes()) {
      if (n->op_type != "Add" || !n->domain.empty() || n->inputs.size() != 2) continue;
      if (g.initializers.count(n->inputs[0]) || g.initializers.count(n->inputs[1])) continue;  // a bias add
      const bool a = from_fusable(n->inputs[0]), b = from_fusable(n->inputs[1]);
      if (!a && !b) continue;
      const std::size_t fused = a ? 0 : 1;
      state.set_fake_fused(*n, fused, true);     // computed inside the convolution's kernel
      state.quantize_activation(*n, 1 - fused);  // the skip branch TensorRT reads as INT8
    }
    keep_float8_in_products(state, g);
  }

  // FP8 runs in TensorRT's matrix products and convolutions only (header comment).
  static void keep_float8_in_products(QuantState& state, const Graph& g) {
    static const std::set<std::string> fp8_ops = {"Conv", "Gemm", "MatMul"};
    for (const Node* n : g.nodes()) {
      const bool product = n->domain.empty() && fp8_ops.count(n->op_type) != 0;
      for (std::size_t i = 0; i < n->inputs.size(); ++i) {
        const QSpec* spec = state.input_spec(*n, i);
        if (spec && spec->is_float8() && !product) state.set_fake_fused(*n, i, true);
      }
    }
  }
};

void register_all(Registrar& r) {
  r.add_backend<VirtualBackend>("virtual");
  r.add_backend<OnnxRuntimeBackend>("onnxruntime");
  r.add_backend<TensorRTBackend>("tensorrt");
}

}  // namespace
}  // namespace sparsebit::backends

SPARSEBIT_PLUGIN("sparsebit.backends.standard", SPARSEBIT_PLUGIN_VERSION, sparsebit::backends::register_all)
