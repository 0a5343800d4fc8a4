#pragma once
/// \file
/// Sparsers rank weights for pruning. A sparser only scores; the host turns scores into
/// masks or removed channels, so every sparser gets ratio handling, N:M grouping, residual
/// channel groups and the report for free.
///
///     class MagnitudeSparser : public sparsebit::Sparser {
///       sparsebit::SparsityPattern pattern() const override { return sparsebit::SparsityPattern::kElement; }
///       at::Tensor scores(const sparsebit::SparseWeight& w) override { return w.weight.abs(); }
///     };
///
/// Note [Sparsity patterns]
/// kElement: any single weight may become zero; the lowest `ratio` of scores in each layer (or
/// over all layers with `scope = "global"`) are zeroed. kNM: in every run of M consecutive
/// weights along the input-channel axis at most N stay non-zero (the highest scores), the
/// layout TensorRT's sparse tensor-core kernels use (2:4). kChannel: whole output channels are
/// removed from the model, with everything that reads them (Note [Channel removal] in
/// sparsebit/core/prune.h); scores() returns one value per output channel.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "sparsebit/sdk/options.h"

namespace sparsebit {

enum class SparsityPattern { kElement, kNM, kChannel };

struct SparserContext {
  const Options& options;  ///< `[sparse.sparser_options]`; unread keys are refused
  std::string where;       ///< config location, for messages
};

/// One weight to score.
struct SparseWeight {
  const at::Tensor& weight;
  std::int64_t channel_axis;  ///< output-channel axis of `weight`
  std::int64_t input_axis;    ///< input-channel axis of `weight`
  std::string node;           ///< the node reading it, for messages
};

class Sparser {
 public:
  virtual ~Sparser() = default;
  virtual SparsityPattern pattern() const = 0;
  /// Importance, higher is kept: the weight's shape for kElement and kNM, a 1-D tensor of the
  /// output-channel count for kChannel. Finite, not negative.
  virtual at::Tensor scores(const SparseWeight& w) = 0;
};

}  // namespace sparsebit
