// disable_unnecessary_quant: in chains that deployment runs as one fused kernel, quantize only
// the chain's input.
//
// A chain starts at Conv, ConvTranspose, Gemm, MatMul, BatchNormalization or Add and continues
// through single-reader edges into BatchNormalization (after a conv/linear head) and element-wise
// activations. ONNX Runtime and TensorRT compute such a chain in one kernel and round once, at
// its end; a Q/DQ pair inside it would make the simulation round twice (and ONNX Runtime's
// optimizer removes such pairs, so the exported model would disagree with the simulation).

#include <map>
#include <set>

#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

const std::set<std::string> kHeads = {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "Add"};
const std::set<std::string> kActivations = {"Relu",        "Clip",      "LeakyRelu", "PRelu", "Sigmoid",
                                            "HardSigmoid", "HardSwish", "Tanh",      "Elu",   "Selu",
                                            "Mish",        "Softplus",  "Gelu"};

class DisableUnnecessaryQuant final : public Pass {
 public:
  Stage stage() const override { return Stage::kFuse; }

  bool run_quant(QuantState& state, const PassContext&) override {
    const Graph& g = state.graph();
    // Readers of every tensor, to follow single-reader edges.
    std::map<std::string, std::vector<const Node*>> readers;
    for (const Node* n : g.nodes())
      for (const auto& in : n->inputs)
        if (!in.empty()) readers[in].push_back(n);
    bool changed = false;
    for (const Node* head : g.nodes()) {
      if (!head->domain.empty() || !kHeads.count(head->op_type) || head->outputs.empty()) continue;
      const bool linear_head = head->op_type != "Add" && head->op_type != "BatchNormalization";
      const Node* cur = head;
      while (true) {
        const std::string& out = cur->outputs[0];
        auto it = readers.find(out);
        if (it == readers.end() || it->second.size() != 1 || g.is_graph_output(out)) break;
        const Node* next = it->second[0];
        if (!next->domain.empty()) break;
        const bool bn = next->op_type == "BatchNormalization" && linear_head && cur == head;
        if (!bn && !kActivations.count(next->op_type)) break;
        if (next->inputs.empty() || next->inputs[0] != out) break;
        if (state.is_quantized(*next, 0)) {
          state.set_fake_fused(*next, 0, true);
          changed = true;
        }
        if (next->outputs.empty()) break;
        cur = next;
      }
    }
    return changed;
  }
};

void register_all(Registrar& r) { r.add_pass<DisableUnnecessaryQuant>("disable_unnecessary_quant"); }

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.disable_unnecessary_quant", SPARSEBIT_PLUGIN_VERSION,
                 sparsebit::passes::register_all)
