#pragma once
/// \file
/// BatchNormalization folding, shared by the fuse_bn pass (float weights) and the QDQ export
/// (quantized weights, whose per-channel scales absorb the factor).
///
/// Note [BatchNormalization as an affine map]
/// In inference mode BatchNormalization is y = x k + shift per channel, with
/// k = gamma / sqrt(var + epsilon) and shift = beta - mean k. After a layer with weight W and
/// bias b whose output channel c is linear in W's channel c, it folds into that layer as
/// W' = W k (channel by channel) and b' = b k + shift. The factors are computed in double.

#include <ATen/core/Tensor.h>

#include <optional>

#include "sparsebit/sdk/export.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

struct SPARSEBIT_API BatchNormAffine {
  at::Tensor scale;  ///< k per channel (double, 1-D)
  at::Tensor shift;  ///< beta - mean k per channel (double, 1-D)
  /// The bias after folding: `bias` k + shift (`bias` broadcast over the channels).
  at::Tensor fold_bias(const at::Tensor& bias) const;
};

/// The affine map of `bn` (Note [BatchNormalization as an affine map]) when it runs in
/// inference mode with its four parameters stored as initializers of one size, else nullopt.
SPARSEBIT_API std::optional<BatchNormAffine> batchnorm_affine(const Graph& graph, const Node& bn);

/// After its parameters were folded into `producer` (the only reader of the BN's input),
/// makes `producer` write the BN's output and removes `bn` from the graph.
SPARSEBIT_API void absorb_batchnorm(Graph& graph, Node& producer, const Node& bn);

}  // namespace sparsebit
