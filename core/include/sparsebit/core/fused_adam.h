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
///
/// After count_steps_on_device(), each group's step count is a tensor on its parameters'
/// device, the bias corrections are computed there and step() reads nothing from the host, so
/// it can be recorded in a CUDA graph and replayed (Note [CUDA graph steps]); sync_steps()
/// writes the count back into the states that save() stores. The values then differ from the
/// host-counted ones by rounding only (division and multiplication where Adam has addcdiv).
class SPARSEBIT_API FusedAdam final : public torch::optim::Adam {
 public:
  FusedAdam(const std::vector<at::Tensor>& params, const torch::optim::AdamOptions& options)
      : torch::optim::Adam(params, options) {}
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Counts steps on the device from now on and returns true; false (nothing changes) with
  /// amsgrad or when the parameters of a group are at different steps. The parameters of a
  /// group then step together (one without a gradient still advances the count); states are
  /// created now for those that have none.
  bool count_steps_on_device();
  bool counts_steps_on_device() const { return !device_steps_.empty(); }
  /// Copies the device counts into the parameters' states (reads the device).
  void sync_steps();

 private:
  void step_on_device();
  std::vector<at::Tensor> device_steps_;  ///< per group: a 0-dim double count
};

/// The state `adam` keeps for parameter `p` (null before its first step).
SPARSEBIT_API torch::optim::AdamParamState* adam_state(torch::optim::Adam& adam, const at::Tensor& p);

}  // namespace sparsebit
