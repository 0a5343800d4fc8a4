#pragma once
/// \file
/// Sparsers decide which weights to prune: given a weight and its output-channel axis they
/// return a mask of the same shape (1 keeps, 0 prunes).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "sparsebit/sdk/options.h"

namespace sparsebit {

struct SparserContext {
  const Options& options;
  std::string where;
};

class Sparser {
 public:
  virtual ~Sparser() = default;
  virtual at::Tensor mask(const at::Tensor& weight, std::int64_t channel_axis) = 0;
};

}  // namespace sparsebit
