// The QDQ exporter: the float graph with QuantizeLinear/DequantizeLinear where the slots
// quantize, BatchNormalization folded where the weights allow, lifted to the backend's opset.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>

#include "base/log.h"
#include "base/mapped_file.h"
#include "quant/qdq_export.h"

#include "base/core_ops.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/saturation.h"
#include "sparsebit/sdk/batchnorm.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit {

namespace {
// Note [Narrow export]
// Opset-13 QuantizeLinear stores 8-bit integers. A b-bit (b < 8) activation is exported as
// QuantizeLinear -> Clip(qmin, qmax) -> DequantizeLinear with the b-bit scale and zero point:
// the 8-bit quantizer's own clamp is wider, so clipping its integers to the b-bit range gives
// exactly clamp(round(x / s) + zp, qmin, qmax), per tensor or per channel alike. Weights are
// stored already quantized. metadata_props["sparsebit.bits"] maps each such quantized tensor to
// its bit width (JSON), and `sparsebit inspect` reads it back.
// Names come from the top-level graph `g` (unique across nesting levels); the nodes and
// initializers go to `h`, the graph of `consumer` (g itself or a control-flow body).
std::string clip_to_grid(Graph& g, Graph& h, const Node* consumer, const QuantSlot& s, const std::string& quantized,
                         at::ScalarType qtype) {
  const std::string lo = g.unique_name(s.tensor + "_qmin"), hi = g.unique_name(s.tensor + "_qmax");
  h.initializers[lo] = at::scalar_tensor(s.spec.qmin(), at::kInt).to(qtype);
  h.initializers[hi] = at::scalar_tensor(s.spec.qmax(), at::kInt).to(qtype);
  Node clip;
  clip.op_type = core_ops::kClip;
  clip.name = g.unique_name(s.tensor + "_clip_to_" + std::to_string(s.spec.bits) + "bit");
  const std::string out = g.unique_name(quantized + "_" + std::to_string(s.spec.bits) + "bit");
  clip.inputs = {quantized, lo, hi};
  clip.outputs = {out};
  h.insert_before(consumer, std::move(clip));
  return out;
}

}  // namespace

std::map<std::string, std::string> qdq_metadata(const QuantSlots& slots) {
  nlohmann::json bits = nlohmann::json::object();
  for (const auto& s : slots.all())
    if (s.active() && s.calibrated && s.role != InputRole::kBias && s.spec.bits < 8) bits[s.tensor] = s.spec.bits;
  if (bits.empty()) return {};
  return {{"sparsebit.bits", bits.dump()}};
}

// Note [4-bit export]
// 4-bit weights are stored as int4 (symmetric) / uint4 (affine) initializers read by
// DequantizeLinear, which needs opset 21; so do 16-bit activations (int16 / uint16 Q/DQ). 4-bit activations use Note
// [Narrow export] (8-bit storage clipped to 16 levels): ONNX Runtime 1.30's graph optimizer moves an int4 activation
// Q/DQ pair across MaxPool and then rejects the MaxPool on int4 data (measured on the
// Fashion-MNIST fixture), while int4 weights behind DequantizeLinear run at every optimization
// level. The graph is lifted from 13 to 21 by the rules of Note [Opset lifting], which keep every
// node and the position of its inputs and add none, so the slots still address the right inputs. Other widths
// below 8 use Note [Narrow export].

namespace {
// Note [BN folding at export]
// A BatchNormalization left in the model (fuse_bn = false, e.g. to train it in QAT) after a Conv
// whose weight is quantized per output channel is folded into that Conv on export: with
// k = gamma / sqrt(var + eps) > 0 per channel, Conv(x, s q) then BN equals Conv(x, (s k) q) plus
// the bias (b - mean) k + beta, so the weight's integers stay, its scales are multiplied by k, and
// an int32 bias (scale s_a s) is requantized at s_a s k. What deployment runs is then exactly
// what was simulated. BNs that cannot be folded this way (per-tensor or float weights shared
// elsewhere, k <= 0, other producers) stay as BatchNormalization nodes.
// The DequantizeLinear that alone feeds `value`, and feeds nothing else.
const Node* single_dequantize(Graph& g, const std::string& value) {
  Node* p = g.producer(value);
  return p && core_ops::is(*p, core_ops::kDequantizeLinear) && g.consumers(value).size() == 1 &&
                 !g.is_graph_output(value)
             ? p
             : nullptr;
}

bool fold_batchnorm(Graph& g, Node* bn, const RunningStatistics& norm, const OpTraitTable& ops) {
  auto init = [&](const std::string& name) -> const at::Tensor* {
    auto it = g.initializers.find(name);
    return it == g.initializers.end() ? nullptr : &it->second;
  };
  const auto affine = norm.affine(g, *bn);  // Note [BatchNormalization as an affine map]
  if (!affine) return false;
  Node* layer = g.producer(bn->inputs[0]);
  const auto* traits = layer ? ops.trait<WeightedLayer>(layer->op_type, layer->domain) : nullptr;
  if (!traits || !layer->has_input(1) || g.consumers(bn->inputs[0]).size() != 1 || g.is_graph_output(bn->inputs[0]))
    return false;
  const auto bias_input = traits->bias_input(*layer);
  const double bias_factor = traits->bias_factor(*layer);
  const Node* wdq = single_dequantize(g, layer->inputs[1]);
  if (!bias_input || bias_factor == 0 || !wdq || wdq->has_attr("block_size") || !init(wdq->inputs[0]) ||
      !init(wdq->inputs[1]))
    return false;
  const at::Tensor& q = *init(wdq->inputs[0]);
  const auto axes = traits->axes(*layer, q.dim());
  std::int64_t dq_axis = wdq->attr_int("axis", 1);
  if (dq_axis < 0) dq_axis += q.dim();
  // The BN's channels (axis 1) must be the layer's output channels, each with its own weight scale.
  if (!axes || axes->output_axis() != 1 || dq_axis != axes->weight_out) return false;
  const at::Tensor scale = *init(wdq->inputs[1]);
  const std::int64_t channels = q.size(dq_axis);
  if (scale.dim() != 1 || scale.size(0) != channels || g.consumers(wdq->inputs[1]).size() != 1) return false;
  const at::Tensor& k = affine->scale;
  if (k.numel() != channels) return false;
  if (!(k > 0).all().item<bool>()) return false;

  // The bias as the output adds it: float, int32 behind DequantizeLinear, or none.
  const std::size_t b_in = *bias_input;
  at::Tensor bias = at::zeros({channels}, at::kDouble);
  const Node* bdq = layer->has_input(b_in) ? single_dequantize(g, layer->inputs[b_in]) : nullptr;
  if (layer->has_input(b_in)) {
    if (bdq) {
      if (!init(bdq->inputs[0]) || !init(bdq->inputs[1]) || g.consumers(bdq->inputs[1]).size() != 1 ||
          g.consumers(bdq->inputs[0]).size() != 1 || init(bdq->inputs[1])->numel() != channels ||
          init(bdq->inputs[0])->numel() != channels)
        return false;
      bias = init(bdq->inputs[0])->to(at::kDouble).reshape({channels}) * init(bdq->inputs[1])->to(at::kDouble);
    } else if (const at::Tensor* b = init(layer->inputs[b_in]);
               b && b->numel() == channels && g.consumers(layer->inputs[b_in]).size() == 1) {
      bias = b->to(at::kDouble).reshape({channels});
    } else {
      return false;
    }
  }
  const at::Tensor folded_bias = affine->fold_bias(bias * bias_factor) / bias_factor;
  g.initializers[wdq->inputs[1]] = (scale.to(at::kDouble) * k).to(scale.scalar_type());
  if (bdq) {
    const at::Tensor bscale = init(bdq->inputs[1])->to(at::kDouble) * k;
    const auto shape = init(bdq->inputs[0])->sizes().vec();
    g.initializers[bdq->inputs[1]] = bscale.to(at::kFloat);
    g.initializers[bdq->inputs[0]] = at::round(folded_bias / bscale).to(at::kInt).reshape(shape);
  } else {
    const std::string name = g.unique_name(bn->name + "_folded_bias");
    g.initializers[name] = folded_bias.to(at::kFloat);
    if (layer->inputs.size() <= b_in) layer->inputs.resize(b_in + 1);
    layer->inputs[b_in] = name;
  }
  absorb_batchnorm(g, *layer, *bn);
  return true;
}

void fold_batchnorms(Graph& g, const OpTraitTable& ops) {
  for (Node* n : g.nodes())
    if (const auto* norm = ops.trait<RunningStatistics>(n->op_type, n->domain);
        norm && !fold_batchnorm(g, n, *norm, ops))
      logs::debug("{}", n->describe() + ": exported unfolded");
}
/// The opset the export needs (the backend's, 13, and 21 for 4-bit, per-group or 16-bit Q/DQ:
/// Note [4-bit export]), and `g` lifted to it.
void lift_for_export(Graph& g, const QdqExportInput& in) {
  std::int64_t opset = std::max<std::int64_t>({g.default_opset(), in.backend.min_export_opset(), 13});
  std::string why = "the backend";
  for (const auto& s : in.slots.all()) {
    if (!in.slots.usable(s) || opset >= 21) continue;
    if (s.spec.is_float8() && opset < 19) {  // float8 Q/DQ came with opset 19
      why = "float8 Q/DQ";
      opset = 19;
      continue;
    }
    if (s.role == InputRole::kWeight && !s.spec.is_float8() && (s.spec.bits == 4 || s.spec.group_size > 0))
      why = "4-bit or per-group Q/DQ";
    else if (s.role == InputRole::kActivation && s.spec.bits == 16) why = "16-bit Q/DQ";
    else continue;
    opset = 21;  // Note [4-bit export]
  }
  if (opset > g.default_opset()) {
    try {
      lift_opset(g, opset, in.ops, static_value_facts(g, in.meta.value_info));
    } catch (const Error& e) {
      throw Error(why + " export needs opset " + std::to_string(opset) + ": " + e.what() +
                  "; export at 8 bits (or keep the node in float with `skip`)");
    }
  }
}

/// Float weights now read by nobody, in the bodies (innermost first: flat order lists a body
/// after the graph around it) and in the main graph.
void drop_unread_float_weights(Graph& g) {
  std::vector<Graph*> graphs;
  for (const FlatNode& f : flat_nodes(g))
    if (std::find(graphs.begin(), graphs.end(), f.graph) == graphs.end()) graphs.push_back(f.graph);
  for (auto it = graphs.rbegin(); it != graphs.rend(); ++it) (*it)->prune_dead();
  g.prune_dead();
}

/// ONNX's FLOAT8E4M3FN (17) or FLOAT8E5M2 (19) for a float8 spec, else 0.
std::int32_t float8_onnx_type(const QSpec& spec) {
  return spec.element == QElement::kFloat8E4M3FN ? 17 : spec.element == QElement::kFloat8E5M2 ? 19 : 0;
}

/// The integers' element type of slot `s` in the exported model. uint16 has no LibTorch dtype:
/// held as int32 and typed UINT16 (4) on export.
at::ScalarType integer_type(const QuantSlot& s) {
  if (s.spec.is_float8()) return at::kByte;  // the codes, typed FLOAT8* on export (float8_onnx_type)
  const bool is_bias = s.role == InputRole::kBias;
  const bool wide = !is_bias && s.spec.bits == 16;
  return is_bias || (wide && !s.spec.symmetric) ? at::kInt
         : wide                                 ? at::kShort
         : s.spec.symmetric                     ? at::kChar
                                                : at::kByte;
}

}  // namespace

std::size_t count_qdq_nodes(const Graph& g) {
  std::size_t n = 0;
  for (const Node* node : g.nodes()) n += core_ops::is_qdq(*node);
  return n;
}

namespace {

/// Puts each quantizer slot's Q/DQ (or its stored integers, or its baked float weight) into the
/// graph being exported, beside the node that reads it (at any nesting level).
class SlotExport {
 public:
  SlotExport(Graph& g, const QdqExportInput& in) : g_(g), in_(in), consumers_(flat_nodes(g)) {
    // Nodes of every nesting level by the slots' node_index (the 13+ rules add no node), with
    // the graph each sits in: Q/DQ of a node inside a control-flow body go into that body.
    if (consumers_.size() != in.executor.flat_size())
      throw Error("internal: lifting for export changed the node count");
  }

  void add(const QuantSlot& s) {
    if (!s.calibrated) throw Error(s.where() + ": not calibrated; calibrate before exporting");
    if (s.spec.bits > 8 && s.spec.bits != 16 && s.role != InputRole::kBias) {
      throw Error(s.where() + ": " + std::to_string(s.spec.bits) +
                  "-bit quantization is simulated only; Q/DQ stores 2-8 or 16 bits (use one of those to export)");
    }
    const bool is_bias = s.role == InputRole::kBias;
    // ONNX's QuantizeLinear reads and DequantizeLinear writes float32, float16 or bfloat16 only:
    // Q/DQ on a float64 tensor is an invalid model that no runtime loads.
    const at::ScalarType element = s.role == InputRole::kActivation ? s.observed_type : constant(s).scalar_type();
    if (element == at::kDouble)
      throw Error(s.where() + ": '" + printable(s.tensor) +
                  "' is float64, which ONNX's QuantizeLinear and DequantizeLinear do not take; convert the model "
                  "to float32 (its initializers, inputs and outputs) and quantize that");
    if (!is_bias && !s.quantizer->affine_grid()) return bake(s);
    const QParams p = is_bias ? s.bias_params : s.quantizer->qparams();
    const at::Tensor scale = p.scale.detach().to(at::kCPU, at::kFloat).contiguous();
    const at::Tensor zp = p.zero_point.detach().to(at::kCPU, at::kInt).to(integer_type(s)).contiguous();
    Node* consumer = consumers_[s.node_index].node;
    const Graph& h = *consumers_[s.node_index].graph;
    std::string key = std::to_string(reinterpret_cast<std::uintptr_t>(&h)) + "|" + s.tensor + "|" + s.spec.describe() +
                      "|" + std::string(static_cast<const char*>(scale.data_ptr()), scale.nbytes()) +
                      std::string(static_cast<const char*>(zp.data_ptr()), zp.nbytes());
    // A weight that several nodes read shares one Q/DQ when the grids agree, unless its rounding
    // was learnt or solved per node (AdaRound, GPTQ): then equal scales do not mean equal integers.
    if (!is_bias && s.learns_weight()) key += "|" + std::to_string(s.node_index);
    auto done = made_.find(key);
    if (done == made_.end()) done = made_.emplace(key, insert_qdq(s, p, scale, zp)).first;
    consumer->inputs[s.input_index] = done->second;
  }

 private:
  const at::Tensor& constant(const QuantSlot& s) const {
    const at::Tensor* t = in_.executor.flat_constant(s.node_index, s.tensor);
    if (!t) throw Error(s.where() + ": internal: its constant is missing");
    return *t;
  }

  /// A quantizer without an integer grid: its simulated weight baked as floats, exactly what
  /// forward() computes.
  void bake(const QuantSlot& s) {
    if (s.role != InputRole::kWeight) {
      throw Error(s.where() + ": quantizer '" + s.quantizer_name +
                  "' has no integer grid QuantizeLinear can express; it cannot quantize exported activations");
    }
    c10::InferenceMode guard;
    const std::string baked = g_.unique_name(s.tensor + "_" + s.quantizer_name);
    consumers_[s.node_index].graph->initializers[baked] = s.quantizer->forward(constant(s)).detach().to(at::kCPU);
    consumers_[s.node_index].node->inputs[s.input_index] = baked;
  }

  /// The scale, zero point and DequantizeLinear of slot `s` before its consumer (after a
  /// QuantizeLinear for an activation, after its stored integers otherwise); the dequantized name.
  std::string insert_qdq(const QuantSlot& s, const QParams& p, const at::Tensor& scale, const at::Tensor& zp) {
    const bool is_bias = s.role == InputRole::kBias, wide = !is_bias && s.spec.bits == 16;
    const at::ScalarType qtype = integer_type(s);
    Node* consumer = consumers_[s.node_index].node;
    Graph& h = *consumers_[s.node_index].graph;
    const std::string base = s.tensor;
    const std::string scale_name = g_.unique_name(base + "_scale");
    h.initializers[scale_name] = scale;
    const std::string zp_name = g_.unique_name(base + "_zero_point");
    h.initializers[zp_name] = zp;
    const std::int32_t narrow = s.spec.is_float8()                                 ? float8_onnx_type(s.spec)
                                : s.role == InputRole::kWeight && s.spec.bits == 4 ? (s.spec.symmetric ? 22 : 21)
                                : wide && !s.spec.symmetric                        ? 4
                                                                                   : 0;
    if (narrow) h.narrow_types[zp_name] = narrow;
    auto axis_attrs = [&](Node& n) {
      if (s.spec.group_size > 0) {  // Note [Per-group quantization]: blocked Q/DQ, opset 21
        n.attributes["axis"] = Attribute::of_int(s.spec.group_axis);
        n.attributes["block_size"] = Attribute::of_int(s.spec.group_size);
      } else if (s.spec.per_channel) {
        n.attributes["axis"] = Attribute::of_int(s.spec.channel_axis);
      }
    };
    std::string quantized;
    if (s.role != InputRole::kActivation) {
      // Weights (and biases) are stored as integers followed by DequantizeLinear. A weight's
      // integers are those of what its quantizer computes (exactly on the grid of p), so
      // quantizers that choose their own rounding (AdaRound) export what they simulated.
      quantized = g_.unique_name(base + "_quantized");
      at::Tensor value = constant(s);
      if (!is_bias) {
        c10::InferenceMode guard;
        value = s.quantizer->forward(value);
      }
      h.initializers[quantized] = s.spec.is_float8()
                                      ? quantize_to_float8(value.detach().to(at::kCPU), p, s.spec)
                                      : quantize_to_int(value.detach().to(at::kCPU), p, s.spec).to(qtype);
      page_out(constant(s));  // Note [Mapped weights]: one weight in memory at a time
      if (narrow) h.narrow_types[quantized] = narrow;
    } else {
      Node q;
      q.op_type = core_ops::kQuantizeLinear;
      q.name = g_.unique_name(base + "_QuantizeLinear");
      quantized = g_.unique_name(base + "_quantized");
      q.inputs = {s.tensor, scale_name, zp_name};
      q.outputs = {quantized};
      axis_attrs(q);
      h.insert_before(consumer, std::move(q));
      if (s.spec.bits < 8 && !narrow)
        quantized = clip_to_grid(g_, h, consumer, s, quantized, qtype);  // Note [Narrow export]
    }
    Node dq;
    dq.op_type = core_ops::kDequantizeLinear;
    dq.name = g_.unique_name(base + "_DequantizeLinear");
    const std::string dequantized = g_.unique_name(base + "_dequantized");
    dq.inputs = {quantized, scale_name, zp_name};
    dq.outputs = {dequantized};
    axis_attrs(dq);
    h.insert_before(consumer, std::move(dq));
    return dequantized;
  }

  Graph& g_;
  const QdqExportInput& in_;
  std::vector<FlatNode> consumers_;
  std::map<std::string, std::string> made_;  // dedupe key -> dequantized tensor name
};

}  // namespace

Graph export_qdq(const QdqExportInput& in) {
  Graph g = in.graph.clone();
  for (const auto& name : in.trained) {  // Note [QAT]: the trained values
    g.initializers[name] = in.executor.constants().at(name).detach().to(at::kCPU).clone();
    if (g.initializers[name].is_floating_point() && !at::isfinite(g.initializers[name]).all().item<bool>())
      throw Error("trained parameter '" + printable(name) +
                  "' holds NaN or infinite values (training diverged, or they were set so): the export would " +
                  "saturate its integers; retrain with a lower learning rate, or calibrate again");
  }
  for (const auto& [name, t] : in.states)  // running statistics
    g.initializers[name.substr(6)] = t.detach().to(at::kCPU).clone();
  lift_for_export(g, in);
  SlotExport slots(g, in);
  for (const auto& s : in.slots.all())
    if (in.slots.usable(s)) slots.add(s);
  fold_batchnorms(g, in.ops);
  try {
    in.backend.adjust_export(g);
  } catch (const Error& e) {
    throw Error("backend '" + in.backend_name + "' (plugin '" + in.backend_plugin +
                "') export adjustment: " + e.what());
  }
  drop_unread_float_weights(g);
  g.topological_sort();
  g.validate();
  if (in.backend.checks_u8s8_saturation()) {  // Note [u8s8 saturation]
    if (auto warning = saturation_warning(check_u8s8_saturation(g, in.ops)); !warning.empty())
      logs::warn("{}", warning);
  }
  return g;
}

}  // namespace sparsebit
