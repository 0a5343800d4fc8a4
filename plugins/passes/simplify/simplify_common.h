#pragma once
// What the simplify passes share: constant lookups, tolerances, the opset check, and the
// registration of each file's passes (simplify_passes.cpp registers them all, in order).

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/pattern.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes::simplify {

using Inputs = Pattern::Inputs;

inline std::optional<at::Tensor> constant(const Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  if (it == g.initializers.end()) return std::nullopt;
  return it->second;
}

/// The value of a one-element floating constant input.
inline std::optional<double> scalar(const Graph& g, const std::string& name) {
  auto t = constant(g, name);
  if (!t || t->numel() != 1 || !t->is_floating_point()) return std::nullopt;
  return t->reshape({}).item<double>();
}

inline bool near(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b)); }

/// The operand of a two-input node that is not `value` (for commutative ops), or "".
inline std::string other_input(const Node& n, const std::string& value) {
  if (n.inputs.size() != 2) return "";
  return n.inputs[0] == value ? n.inputs[1] : n.inputs[1] == value ? n.inputs[0] : "";
}

inline bool opset_at_least(const Graph& g, std::int64_t v, const char* pass, const char* op) {
  if (g.default_opset() >= v) return true;
  sdk::log_debug(std::string(pass) + ": the model's opset " + std::to_string(g.default_opset()) + " has no " + op +
                 " (needs " + std::to_string(v) + "); pattern left as is");
  return false;
}

/// fuse_bn, fuse_affine (simplify_folds.cpp).
void register_folds(Registrar& r);
/// fuse_matmul_add, fuse_hardsigmoid, fuse_hardswish, fuse_gelu, fuse_layernorm, fuse_pad
/// (simplify_fusions.cpp).
void register_fusions(Registrar& r);
/// fuse_activations, move_transposes (simplify_activations.cpp).
void register_activations(Registrar& r);

}  // namespace sparsebit::passes::simplify
