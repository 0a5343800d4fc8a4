#pragma once
/// \file
/// MatMul / Gemm layers with blocked DequantizeLinear weights -> ONNX Runtime's
/// com.microsoft.MatMulNBits (Note [MatMulNBits export] in matmul_nbits.cpp). The exporter
/// applies it under `[export] weight_format = "matmul_nbits"`; it works on any QDQ graph.

#include <cstddef>
#include <cstdint>

#include "sparsebit/sdk/graph.h"

namespace sparsebit {

/// Rewrites the eligible layers of `g` in place (the rest keep DequantizeLinear, each named in
/// the log) and returns how many became MatMulNBits. accuracy_level: 0 to 4, as ONNX Runtime
/// defines it (4: int8 compute on the CPU).
SPARSEBIT_API std::size_t to_matmul_nbits(Graph& g, std::int64_t accuracy_level);

}  // namespace sparsebit
