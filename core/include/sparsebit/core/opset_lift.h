#pragma once
/// \file
/// Opset lifting: rewrites a graph's default-domain nodes from the model's opset to a newer one
/// (13 for per-channel Q/DQ, 21 for int4 / int16 / blocked Q/DQ) in the IR, one rule per op and
/// per opset where the op's meaning changed. ONNX's own version converter needs static shapes
/// that its shape inference does not find in real exporters' graphs (Shape -> Slice -> Concat ->
/// Reshape chains with symbolic dims); these rules need a rank or an element type at most, and
/// take it from what the file declares, from a light propagation, or from one run of the float
/// model on a sample (the executor runs every opset the rules start from).
///
/// Note [Opset lifting]
/// Every op the executor runs is either listed as unchanged in meaning from opset 7 to 21 (its
/// versions only widened types or added attributes whose defaults keep the old behaviour) or has
/// rules: Softmax/LogSoftmax/Hardmax (13: the axis no longer flattens the tail; kept when the
/// axis is the last one, else Flatten -> op -> Reshape(Shape(x))), Split (13: sizes become an
/// input; 18: num_outputs when there are none), Squeeze/Unsqueeze/ReduceSum (13) and the other
/// Reduce* (18): axes become an input, Clip and Pad (11): attributes become inputs typed like the
/// data, Slice and TopK (10), Upsample (10: Resize) and Resize-10 (11: explicit asymmetric
/// coordinates and floor rounding), Scatter (11: ScatterElements), BatchNormalization (9:
/// spatial; 14: training outputs) and Dropout (10: mask type; 12: ratio), GroupNormalization
/// (21: scale and bias per channel), RoiAlign (16) and GridSample (20). Rules never erase a
/// node and keep the position of every existing input; from 13 on they add no node either, so
/// quantizer slots that refer to (node index, input) stay valid when the exporter lifts 13 -> 21.
/// Anything else (an unknown op of the default domain, control flow with subgraphs, a rule's
/// precondition that does not hold) is refused with an Error naming the node, its op and what
/// is unknown or unsupported.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

class Registry;
struct Model;

/// What is known about a value. rank < 0: unknown; elem_type 0: unknown (ONNX type numbers);
/// dims empty when unknown, -1 for a single unknown dim.
struct ValueFact {
  std::int64_t rank = -1;
  std::int32_t elem_type = 0;
  std::vector<std::int64_t> dims;
};
using ValueFacts = std::map<std::string, ValueFact>;

/// Facts from the graph alone: declared inputs, outputs and `declared` value_info, initializers,
/// then ranks and element types propagated through the ops whose rules are simple.
SPARSEBIT_API ValueFacts static_value_facts(const Graph& graph, const std::vector<ValueInfo>& declared = {});

/// Facts from one run of the float graph on `sample` (one tensor per graph input): the rank,
/// element type and shape of every value a node reads, and of the graph outputs.
SPARSEBIT_API ValueFacts observed_value_facts(const Graph& graph, const Registry& registry,
                                              const std::vector<at::Tensor>& sample);

struct LiftReport {
  std::int64_t from = 0, to = 0;
  std::vector<std::string> rewrites;  ///< one line per rewritten node
  bool checked = false;               ///< outputs compared with the original on a sample
  double max_abs_diff = 0;            ///< largest output difference found by the check
};

/// Lifts `graph` to `target` in place (nothing when it is there already). Throws Error naming
/// the node and op on anything that cannot be lifted; the graph is then unchanged.
SPARSEBIT_API LiftReport lift_opset(Graph& graph, std::int64_t target, const ValueFacts& facts = {});

/// The pipeline's lifting step: facts from the model's declarations and one run on `sample`,
/// the lift, then the lifted graph run on the same sample and its outputs compared with the
/// original's (an Error naming the output if they differ). `sample` may be empty: the lift then
/// uses static facts and is not checked.
SPARSEBIT_API LiftReport lift_model(Model& model, std::int64_t target, const Registry& registry,
                                    const std::vector<at::Tensor>& sample);

/// The pipeline's first step, used by the CLI and library users alike: imports `path` (models
/// older than opset 7 through ONNX's converter) and, below `target`, lifts it with lift_model() on
/// the first sample of the calibration data `calib` (static facts only when `calib` is empty).
SPARSEBIT_API Model load_and_lift(const std::string& path, const Registry& registry, const DataSource& calib,
                                  std::int64_t target = 13);

/// Lowest opset the executor runs without ONNX's converter: older models are converted to it on
/// import, and lifted from there by the rules above.
constexpr std::int64_t kMinLiftableOpset = 7;

}  // namespace sparsebit
