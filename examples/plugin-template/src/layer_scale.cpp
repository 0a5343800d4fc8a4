// An op with a weight. A QModule says which inputs are quantized and how the op runs; it is
// created once per node, so attributes are read and validated in the constructor.

#include <ATen/ATen.h>

#include "example.h"

namespace example {

class LayerScale final : public sparsebit::NodeQModule {
 public:
  explicit LayerScale(const sparsebit::OpContext& ctx) : sparsebit::NodeQModule(ctx) {
    if (ctx.node.inputs.size() != 2) throw sparsebit::Error(describe() + ": LayerScale takes two inputs (x, gamma)");
  }

  std::vector<sparsebit::InputSpec> input_specs() const override {
    // Input 0: an activation (the [a] scheme). Input 1: a weight, one channel per element.
    return {{sparsebit::InputRole::kActivation, 0}, {sparsebit::InputRole::kWeight, 0}};
  }

  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const at::Tensor& gamma = in.at(1);
    if (gamma.dim() != 1 || x.dim() < 1 || x.size(-1) != gamma.size(0)) {
      throw sparsebit::Error(describe() + ": gamma of shape " + c10::str(gamma.sizes()) +
                             " does not scale the last axis of an input of shape " + c10::str(x.sizes()));
    }
    return {x * gamma};  // ATen ops: runs on any device, autograd flows through
  }

 private:
};

void register_layer_scale(sparsebit::Registrar& r) { r.add_op<LayerScale>("LayerScale", "com.example"); }

}  // namespace example
