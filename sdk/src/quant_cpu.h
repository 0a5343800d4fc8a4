// fake_quantize on the CPU in one pass, where the layout allows (quant_cpu.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "sparsebit/sdk/quant.h"

namespace sparsebit::detail {

/// x fake-quantized with the float32 operations of the division formula (divide, round half to
/// even, add, clamp, subtract, multiply) in one pass over x, or an undefined tensor where the
/// fused path does not apply (not float32 on the CPU, float8, parameters per runs of fewer than
/// 16 values): the caller then runs the ATen formulation.
at::Tensor cpu_fake_quantize(const at::Tensor& x, const QParams& p, const QSpec& spec);

}  // namespace sparsebit::detail
