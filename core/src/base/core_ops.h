#pragma once
// The ONNX ops the core itself runs or writes, named once. Every other op is known through its
// plugin's traits (sdk/op_traits.h); `tools/count-op-literals.py` counts the names left in the
// core, and each one here says why the core, not a plugin, owns it.
#include <string_view>

#include <sparsebit/sdk/graph.h>

namespace sparsebit::core_ops {

// Control flow: the executor runs the subgraphs and the lifter rewrites them (Note [Control flow]
// in executor.h).
inline constexpr std::string_view kIf = "If";
inline constexpr std::string_view kLoop = "Loop";
inline constexpr std::string_view kScan = "Scan";
inline constexpr std::string_view kSequenceMap = "SequenceMap";

// The export format: Q/DQ pairs are what the exporter writes, and what inspect, the saturation
// check and the MatMulNBits rewrite read back; MatMulNBits (com.microsoft) is the packed 4-bit
// weight form.
inline constexpr std::string_view kQuantizeLinear = "QuantizeLinear";
inline constexpr std::string_view kDequantizeLinear = "DequantizeLinear";
inline constexpr std::string_view kMatMulNBits = "MatMulNBits";
// A ReLU6 folded into its quantized range is written back as the Clip it stands for.
inline constexpr std::string_view kClip = "Clip";

// A float16 or bfloat16 model is computed in float32 and exported with Casts at its inputs and
// outputs (Note [Half-precision models]).
inline constexpr std::string_view kCast = "Cast";

// ONNX's Constant node is a value, not a computation: the importer and the pruner read it as one.
inline constexpr std::string_view kConstant = "Constant";

// The nodes the lifter writes when it turns an opset-8 Scan into a Loop over a Scan-9; channel
// removal also reads an Identity of a weight as the weight (exporters share weights that way).
inline constexpr std::string_view kShape = "Shape";
inline constexpr std::string_view kGather = "Gather";
inline constexpr std::string_view kIdentity = "Identity";

inline bool is(const Node& n, std::string_view op) { return n.domain.empty() && n.op_type == op; }

/// A QuantizeLinear or DequantizeLinear of the default domain.
inline bool is_qdq(const Node& n) { return is(n, kQuantizeLinear) || is(n, kDequantizeLinear); }

}  // namespace sparsebit::core_ops
