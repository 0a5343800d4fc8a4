#pragma once
/// \file
/// Note [u8s8 saturation]
/// On x86 processors without VNNI (AVX2, AVX-512 without VNNI), ONNX Runtime's integer kernels
/// (QLinearConv, QGemm, MatMulInteger: what its graph optimizer fuses a QDQ Conv/Gemm/MatMul
/// into) multiply uint8 activations by int8 weights with vpmaddubsw, which adds each pair of
/// adjacent products along the reduction axis into a saturating 16-bit integer. With
/// activations up to 255 a pair can exceed 32767 once |w_i| + |w_j| > 128, and the layer then
/// computes something else than the QDQ model says (measured: -1.06 points top-1 on the bundled
/// Fashion-MNIST example; VNNI's vpdpbusd accumulates in 32 bits and matches). Signed 8-bit
/// activations are shifted to unsigned by ONNX Runtime first, so the same bound holds.
///
/// The check below reads the exported integers: for every Conv / MatMul / Gemm whose weight is
/// an int8 initializer behind DequantizeLinear and whose activation is dequantized from 8 bits,
/// it pairs the weights as the kernels do (Conv: per output channel in ONNX Runtime's
/// channels-last filter order, kernel position major and input channel minor; MatMul and Gemm:
/// along K of B) and reports the layers where some pair has (|w_i| + |w_j|) x 255 > 32767. A
/// 7-bit weight grid (QSpec::reduce_range) keeps every pair within 64 + 64 and can never
/// saturate; so can no layer the check passes.

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/sdk/graph.h"

namespace sparsebit {

struct SaturationRisk {
  std::string node, op_type, weight;  ///< the layer and its weight's integer initializer
  std::int64_t pairs = 0;             ///< adjacent weight pairs the kernels add
  std::int64_t pairs_over = 0;        ///< pairs with (|w_i| + |w_j|) x 255 > 32767
  std::int64_t worst_pair = 0;        ///< largest |w_i| + |w_j|
};

struct SaturationCheck {
  std::int64_t layers_checked = 0;      ///< layers with 8-bit activations and int8 weights
  std::vector<SaturationRisk> at_risk;  ///< those that can saturate
};

class OpTraitTable;

/// Runs the check on an exported QDQ graph: its layers of the default domain (WeightedLayer in
/// `ops`) whose weights pair in integer kernels (WeightedLayer::reduction_rows).
SPARSEBIT_API SaturationCheck check_u8s8_saturation(const Graph& qdq, const OpTraitTable& ops);

/// The warning for `check` (empty when nothing is at risk): every layer named, and what to do.
SPARSEBIT_API std::string saturation_warning(const SaturationCheck& check);

}  // namespace sparsebit
