#pragma once
/// \file
/// Adam stepping all parameters of a group at once (Note [Fused Adam]); what `qat` and
/// `prune --finetune` train with, for applications' own loops too:
///
///     sparsebit::FusedAdam adam(qm.parameters(), torch::optim::AdamOptions(1e-4));

#include <torch/optim/adam.h>

#include <vector>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// Note [Fused Adam]
/// torch::optim::Adam steps one parameter at a time: about ten ATen operators per parameter, so
/// a ResNet-50's hundred-odd trained tensors cost over a thousand dispatches per step. FusedAdam
/// does the same arithmetic, operator for operator, on all the parameters of a group at once with
/// ATen's _foreach_ operators (one multi-tensor kernel each on CUDA): the same values to the bit
/// on the CPU (test), the same state and checkpoints (it is an Adam: save and load unchanged).
/// amsgrad falls back to the base class.
class SPARSEBIT_API FusedAdam final : public torch::optim::Adam {
 public:
  FusedAdam(const std::vector<at::Tensor>& params, const torch::optim::AdamOptions& options)
      : torch::optim::Adam(params, options) {}
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace sparsebit
