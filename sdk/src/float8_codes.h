#pragma once
// The SDK's own use of float8 byte codes (float8.cpp), not part of its public headers.

#include <ATen/core/Tensor.h>

#include "sparsebit/sdk/quant.h"

namespace sparsebit::detail {

/// The float8 codes (uint8) of values r that round_to_float8 gave for `element`.
at::Tensor encode_float8(const at::Tensor& r, QElement element);

}  // namespace sparsebit::detail
