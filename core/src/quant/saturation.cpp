// The u8 x s8 pair-saturation check of Note [u8s8 saturation].
#include "sparsebit/core/saturation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/op_traits.h"
#include "base/core_ops.h"

namespace sparsebit {
namespace {

constexpr std::int64_t kMaxActivation = 255, kPairLimit = 32767;

bool eight_bit_activation(const Graph& g, const std::map<std::string, const Node*>& producer,
                          const std::string& value) {
  auto p = producer.find(value);
  if (p == producer.end() || !core_ops::is(*p->second, core_ops::kDequantizeLinear)) return false;
  const Node& dq = *p->second;
  if (g.initializers.count(dq.inputs.at(0))) return false;  // a constant, not an activation
  if (!dq.has_input(2)) return true;                        // uint8 by default
  auto zp = g.initializers.find(dq.inputs[2]);
  if (zp == g.initializers.end() || g.narrow_types.count(dq.inputs[2])) return false;
  const auto t = zp->second.scalar_type();
  return t == at::kByte || t == at::kChar;
}

// The layers of `qdq` and, recursively, of its If/Loop/Scan bodies (the exporter puts a body
// layer's Q/DQ and quantized weight inside the body, next to it).
void check_graph(const Graph& qdq, const OpTraitTable& ops, SaturationCheck& check) {
  std::map<std::string, const Node*> producer;
  for (const Node* n : qdq.nodes())
    for (const auto& o : n->outputs) producer[o] = n;
  for (const Node* n : qdq.nodes()) {
    for (const Graph* body : n->subgraphs()) check_graph(*body, ops, check);
    // ONNX Runtime's integer kernels run layers of the default domain (WeightedLayer, Note [Op traits]).
    const auto* layer = n->domain.empty() ? ops.trait<WeightedLayer>(n->op_type, n->domain) : nullptr;
    if (!layer || !n->has_input(1)) continue;
    auto p = producer.find(n->inputs[1]);
    if (p == producer.end() || !core_ops::is(*p->second, core_ops::kDequantizeLinear)) continue;
    const std::string& weight = p->second->inputs.at(0);
    auto w = qdq.initializers.find(weight);
    if (w == qdq.initializers.end() || w->second.scalar_type() != at::kChar || qdq.narrow_types.count(weight)) continue;
    if (!eight_bit_activation(qdq, producer, n->inputs[0])) continue;
    at::Tensor rows = layer->reduction_rows(*n, w->second);
    if (!rows.defined() || rows.numel() == 0) continue;
    ++check.layers_checked;
    rows = rows.to(at::kInt).abs();
    if (rows.size(1) % 2) rows = at::constant_pad_nd(rows, {0, 1});  // an odd K pairs its last weight with 0
    const at::Tensor sums = rows.reshape({rows.size(0), -1, 2}).sum(-1);
    SaturationRisk r;
    r.node = n->name;
    r.op_type = n->op_type;
    r.weight = weight;
    r.pairs = sums.numel();
    r.worst_pair = sums.max().item<std::int64_t>();
    r.pairs_over = (sums * kMaxActivation > kPairLimit).sum().item<std::int64_t>();
    if (r.pairs_over > 0) check.at_risk.push_back(std::move(r));
  }
}

}  // namespace

SaturationCheck check_u8s8_saturation(const Graph& qdq, const OpTraitTable& ops) {
  SaturationCheck check;
  check_graph(qdq, ops, check);
  return check;
}

std::string saturation_warning(const SaturationCheck& check) {
  if (check.at_risk.empty()) return {};
  std::string s = std::to_string(check.at_risk.size()) + " of " + std::to_string(check.layers_checked) +
                  " Conv/MatMul/Gemm layers can saturate ONNX Runtime's 16-bit u8 x s8 pair sums on x86 processors "
                  "without VNNI, where their results will differ from the simulation:";
  // The layers with the largest share of pairs over first; a long list buries the advice, and
  // `sparsebit inspect` prints every layer.
  std::vector<const SaturationRisk*> worst;
  for (const auto& r : check.at_risk) worst.push_back(&r);
  std::stable_sort(worst.begin(), worst.end(), [](const SaturationRisk* a, const SaturationRisk* b) {
    return double(a->pairs_over) / double(a->pairs) > double(b->pairs_over) / double(b->pairs);
  });
  constexpr std::size_t kListed = 3;
  for (std::size_t i = 0; i < worst.size() && i < kListed; ++i) {
    const SaturationRisk& r = *worst[i];
    s += " node '" + r.node + "' (" + r.op_type + ", " + std::to_string(r.pairs_over) + " of " +
         std::to_string(r.pairs) + " weight pairs over, worst |w_i| + |w_j| = " + std::to_string(r.worst_pair) + ");";
  }
  if (worst.size() > kListed)
    s += " and " + std::to_string(worst.size() - kListed) + " more (`sparsebit inspect` on the output lists them);";
  s += " set [w] reduce_range = true to put weights on a 7-bit grid, which cannot saturate, when deploying on such "
       "processors (those with VNNI are not affected)";
  return s;
}

}  // namespace sparsebit
