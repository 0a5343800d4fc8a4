#pragma once
// What the contrib plugin's two files share.

#include <ATen/core/Tensor.h>

#include <vector>

#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {

inline constexpr const char* kMs = "com.microsoft";

/// Input i, or an undefined tensor where the node has fewer inputs.
inline const at::Tensor& optional_input(const std::vector<at::Tensor>& in, std::size_t i) {
  static const at::Tensor none;
  return i < in.size() ? in[i] : none;
}

/// Attention, MultiHeadAttention, RotaryEmbedding, GroupQueryAttention (contrib_attention.cpp).
void register_attention_ops(Registrar& r);

}  // namespace sparsebit::ops
