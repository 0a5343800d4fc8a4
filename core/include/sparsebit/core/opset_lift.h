#pragma once
/// \file
/// Opset lifting: rewrites a graph's default-domain nodes from the model's opset to a newer one
/// (13 for per-channel Q/DQ, 21 for int4 / int16 / blocked Q/DQ) in the IR, one rule per op and
/// per opset where the op's meaning changed. ONNX's own version converter needs static shapes
/// that its shape inference does not find in real exporters' graphs (Shape -> Slice -> Concat ->
/// Reshape chains with symbolic dims); these rules need a rank or an element type at most, and
/// take it from what the file declares, from ONNX's shape inference (which finds ranks and types
/// where it cannot find dims), or from one run of the float model on a sample (the executor runs
/// every opset the rules start from).
///
/// Note [Opset lifting]
/// The rules belong to the ops: the plugin that registers an op of the default domain tells how
/// its meaning changed across opsets with the LiftsOpset trait (sdk/op_traits.h): the versions
/// where it changed, and a rewrite from the meaning before each to the meaning at it (an empty
/// list: the op kept its meaning from opset 7 on, its versions only widened types or added
/// attributes and inputs whose defaults keep the old behaviour). The shipped op plugins give
/// them for every op they register that exists before opset 21; for example Softmax (13: the
/// axis no longer flattens the tail), Split (13, 18), Squeeze/Unsqueeze/ReduceSum (13) and the
/// other Reduce* (18), Clip and Pad (11), Slice and TopK (10), Upsample (10: Resize), Resize-10
/// (11), Scatter (11), BatchNormalization (9, 14), Dropout (10, 12), GroupNormalization (21),
/// RoiAlign (16) and GridSample (20). Control flow is the core's: If and Loop keep their meaning
/// and their bodies are lifted the same way; Scan-8 becomes a Loop over a Scan-9. Rules never
/// erase a node and keep the position of every existing input; from 13 on they add no node
/// either, so quantizer slots that refer to (node index, input) stay valid when the exporter
/// lifts 13 -> 21. Anything else (an op without rules, an op no plugin registers, a rule's
/// precondition that does not hold) is refused with an Error naming the node, its op, the
/// plugin and what to do.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

class OpTraitTable;
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
/// then what ONNX's shape inference finds for the other values (run in a child process on the
/// graph's structure, weights without their data).
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

/// Lifts `graph` to `target` in place (nothing when it is there already) by the rules its ops
/// give (LiftsOpset in `ops`). Throws Error naming the node and op on anything that cannot be lifted; the graph is
/// then unchanged.
SPARSEBIT_API LiftReport lift_opset(Graph& graph, std::int64_t target, const OpTraitTable& ops,
                                    const ValueFacts& facts = {});

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
