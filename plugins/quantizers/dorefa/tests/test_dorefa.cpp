// dorefa: weights on their grid, exported as floats.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "quantizer_testing.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

TEST(Quantizers, DorefaWeightsLieOnTheirGridAndExportAsFloats) {
  QSpec s;
  s.is_weight = true;
  s.bits = 2;
  auto q = make_quantizer("dorefa", s);
  at::manual_seed(9);
  at::Tensor w = at::randn({64});
  at::Tensor y = q->forward(w);
  // 2 bits: w_q in {-1, -1/3, 1/3, 1}.
  at::Tensor grid = at::tensor({-1.0f, -1.0f / 3, 1.0f / 3, 1.0f});
  at::Tensor dist = std::get<0>((y.unsqueeze(1) - grid.unsqueeze(0)).abs().min(1));
  EXPECT_LT(dist.max().item<float>(), 1e-6);
  EXPECT_FALSE(q->affine_grid());

  Config c = Config::from_file(source_path("configs/w8a8_onnxruntime.toml"));
  c.backend = "virtual";
  c.w.quantizer = "dorefa";
  c.calibration.count = 16;
  QuantModel qm(load_onnx(fixture_model()), c, shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", qm.graph().inputs);
  qm.calibrate(*data);
  Graph g = qm.export_graph();
  const Node* conv = g.find_node("/conv2/Conv");
  ASSERT_TRUE(conv);
  at::Tensor exported = g.initializers.at(conv->inputs[1]);
  const QuantSlot* slot = nullptr;
  for (const auto& sl : qm.slots())
    if (sl.node_name == "/conv2/Conv" && sl.role == InputRole::kWeight) slot = &sl;
  ASSERT_TRUE(slot);
  at::Tensor simulated = slot->quantizer->forward(qm.executor().constants().at(slot->tensor));
  EXPECT_TRUE(at::equal(exported, simulated.detach()));
}

}  // namespace
}  // namespace sparsebit::testing
