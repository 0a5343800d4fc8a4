// A backend: the rules of a (fictional) accelerator, "example_npu".
//   - INT8 only, symmetric (zero point 0), activations per tensor;
//   - weights only on the ops its compiler maps to its MAC array;
//   - its compiler reads standard ONNX, so the export lowers com.example:LayerScale to Mul.

#include <set>

#include "example.h"

namespace example {

class ExampleNpuBackend final : public sparsebit::Backend {
 public:
  std::string description() const override { return "example NPU: symmetric INT8, per-tensor activations"; }

  std::optional<std::string> check(const sparsebit::QSpec& s, const std::string& table) const override {
    if (s.bits != 8) return table + ".bits must be 8 on the example NPU";
    if (!s.symmetric) return table + ".qscheme must be symmetric (the example NPU has no zero points)";
    if (!s.is_weight && s.per_channel) return table + ".qscheme: activations are per tensor on the example NPU";
    return std::nullopt;
  }

  std::optional<std::string> check_input(const sparsebit::Node& node, std::size_t, sparsebit::InputRole role,
                                         const sparsebit::QSpec&) const override {
    static const std::set<std::string> mac_ops = {"Conv", "Gemm", "MatMul", "LayerScale"};
    if (role == sparsebit::InputRole::kWeight && !mac_ops.count(node.op_type))
      return "the example NPU takes quantized weights only on Conv, Gemm, MatMul and LayerScale";
    return std::nullopt;
  }

  void adjust_export(sparsebit::Graph& g) const override {
    bool other_custom_ops = false;
    for (sparsebit::Node* n : g.nodes()) {
      if (n->domain == "com.example" && n->op_type == "LayerScale") {
        n->op_type = "Mul";  // same broadcasting semantics over the last axis
        n->domain.clear();
      } else if (n->domain == "com.example") {
        other_custom_ops = true;
      }
    }
    if (!other_custom_ops) g.opset_imports.erase("com.example");
  }
};

void register_example_npu_backend(sparsebit::Registrar& r) { r.add_backend<ExampleNpuBackend>("example_npu"); }

}  // namespace example
