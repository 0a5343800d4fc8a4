#include "sparsebit/sdk/batchnorm.h"

#include <ATen/ATen.h>

namespace sparsebit {

at::Tensor BatchNormAffine::fold_bias(const at::Tensor& bias) const { return bias.to(at::kDouble) * scale + shift; }

std::optional<BatchNormAffine> batchnorm_affine(const Graph& graph, const Node& bn) {
  if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.inputs.size() < 5 ||
      bn.attr_int("training_mode", 0) != 0)
    return std::nullopt;
  for (std::size_t i = 1; i < bn.outputs.size(); ++i)
    if (!bn.outputs[i].empty()) return std::nullopt;  // training-mode statistics outputs
  std::vector<at::Tensor> p;
  for (std::size_t i = 1; i < 5; ++i) {
    auto it = graph.initializers.find(bn.inputs[i]);
    if (!bn.has_input(i) || it == graph.initializers.end() || it->second.dim() != 1 || !it->second.is_floating_point())
      return std::nullopt;
    p.push_back(it->second.to(at::kDouble));
  }
  for (const auto& t : p)
    if (t.numel() != p[0].numel()) return std::nullopt;
  BatchNormAffine a;
  a.scale = p[0] / at::sqrt(p[3] + bn.attr_float("epsilon", 1e-5));
  a.shift = p[1] - p[2] * a.scale;
  return a;
}

void absorb_batchnorm(Graph& graph, Node& producer, const Node& bn) {
  for (auto& out : producer.outputs)
    if (out == bn.inputs[0]) out = bn.outputs[0];
  graph.erase(&bn);
}

}  // namespace sparsebit
