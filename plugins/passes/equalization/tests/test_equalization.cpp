// Cross-layer equalization.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"

#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

// Conv -> ReLU -> depthwise Conv -> LeakyRelu -> Conv where two output channels of the first
// conv are 50x larger than the rest and the depthwise conv scales them back down (the imbalance
// training leaves and equalization targets): equalization keeps the function and shrinks the
// per-tensor weight-quantization error of the whole model.
TEST(Equalization, KeepsTheFunctionAndHelpsPerTensorWeights) {
  at::manual_seed(3);
  Builder b({2, 3, 8, 8});
  at::Tensor w1 = at::randn({6, 3, 3, 3}) * 0.2;
  w1.narrow(0, 0, 2).mul_(50);
  b.constant("w1", w1);
  b.constant("b1", at::randn({6}));
  at::Tensor w2 = at::randn({6, 1, 3, 3});
  w2.narrow(0, 0, 2).div_(50);
  b.constant("w2", w2);
  b.constant("w3", at::randn({4, 6, 1, 1}));
  b.add("conv1", "Conv", {"x", "w1", "b1"}, {"c1"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  b.add("relu", "Relu", {"c1"}, {"r1"});
  b.add("dw", "Conv", {"r1", "w2"}, {"c2"}, {{"group", Attribute::of_int(6)}});
  b.add("leaky", "LeakyRelu", {"c2"}, {"r2"}, {{"alpha", Attribute::of_float(0.1)}});
  b.add("pw", "Conv", {"r2", "w3"}, {"y"});
  const at::Tensor x = at::randn({2, 3, 8, 8});
  Graph g = apply_and_compare(b.g, "cross_layer_equalization", x);
  EXPECT_EQ(ops(g), ops(b.g));
  auto spread = [](const at::Tensor& w) {
    const at::Tensor r = w.abs().reshape({w.size(0), -1}).amax(1);
    return (r.max() / r.min()).item<double>();
  };
  const Node* conv1 = nullptr;
  for (const Node* n : g.nodes())
    if (n->name == "conv1") conv1 = n;
  EXPECT_LT(spread(g.initializers.at(conv1->inputs[1])), spread(w1) / 5);

  auto weight_quant_error = [&](const Graph& graph) {
    Model m{graph.clone(), ModelMeta{}};
    Config c = Config::from_string(
        "backend = \"virtual\"\n[w]\nqscheme = \"per-tensor-symmetric\"\n[a]\ndisable = true\n", "w.toml");
    QuantModel qm(std::move(m), c, shipped_registry());
    TempDir dir;
    write_npy(x, dir / "x.npy");
    auto data = open_dataset(dir / "x.npy", qm.graph().inputs);
    qm.calibrate(*data);
    const at::Tensor ref = qm.forward({x})[0];
    qm.set_quant(true, false);
    return (qm.forward({x})[0] - ref).pow(2).mean().item<double>();
  };
  const double before = weight_quant_error(b.g), after = weight_quant_error(g);
  std::printf("per-tensor int8 weights, output MSE: %.3g before equalization, %.3g after\n", before, after);
  EXPECT_LT(after, before / 4);
}

}  // namespace
}  // namespace sparsebit::testing
