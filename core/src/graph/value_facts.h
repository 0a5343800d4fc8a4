#pragma once
// Value facts (rank, element type, dims) for opset lifting: from declarations and ONNX's shape
// inference, or observed on a sample (value_facts.cpp).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "sparsebit/core/opset_lift.h"

namespace sparsebit::detail {

/// Runs `graph` on `sample`; records what every value read looked like into *facts if given.
std::vector<at::Tensor> run_sample(const Graph& graph, const Registry& registry, const std::vector<at::Tensor>& sample,
                                   ValueFacts* facts);

}  // namespace sparsebit::detail
