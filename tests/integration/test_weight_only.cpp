// Weight-only quantization through the pipeline (Note [Weight-only quantization] in config.cpp):
// [w] without [a], per-group 4-bit MatMul weights rounded by GPTQ in the layerwise runner, and
// the exported graph run by our executor to the simulated outputs.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "sparsebit/core/quant_model.h"
#include "test_support.h"

namespace sparsebit {
namespace {

/// x [n, 32] -> MatMul(W) -> Tanh -> MatMul(W) -> y: one weight read by two layers whose inputs
/// differ, as exporters write weights tied across layers.
Graph tied_layers() {
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  at::manual_seed(11);
  g.initializers["w"] = at::randn({32, 32}) * 0.3;
  g.append(testing::make_node("first", "MatMul", {"x", "w"}, {"h"}));
  g.append(testing::make_node("act", "Tanh", {"h"}, {"t"}));
  g.append(testing::make_node("second", "MatMul", {"t", "w"}, {"y"}));
  return g;
}

class Rows final : public Dataset {
 public:
  explicit Rows(at::Tensor x) : x_(std::move(x)) {}
  std::string describe() const override { return "test rows"; }
  std::optional<std::int64_t> num_samples() const override { return x_.size(0); }
  std::optional<Batch> next() override {
    if (done_) return std::nullopt;
    done_ = true;
    Batch b;
    b.inputs = {x_};
    b.batched = true;
    b.source = "test rows";
    return b;
  }

 private:
  at::Tensor x_;
  bool done_ = false;
};

TEST(WeightOnly, GptqRoundsATiedWeightPerLayerAndTheExportKeepsBoth) {
  const Config c = Config::from_string(R"(
[w]
qscheme = "per-group-symmetric"
bits = 4
group_size = 32
quantizer = "gptq"
[calibration]
mode = "asym"
batch_size = 256
)",
                                       "test.toml");
  EXPECT_TRUE(c.weight_only);
  QuantModel qm(Model{tied_layers(), {}}, c, testing::shipped_registry());
  at::manual_seed(12);
  const at::Tensor x = at::randn({256, 32}).mm(at::randn({32, 32}) * 0.4 + at::eye(32));
  Rows data(x);
  const CalibrationStats stats = qm.calibrate(data);
  ASSERT_EQ(stats.reconstructions.size(), 2u);
  for (const auto& r : stats.reconstructions) {
    EXPECT_EQ(r.quantizer, "gptq");
    EXPECT_LT(r.mse_learnt, r.mse_nearest) << r.node;
  }
  // Activations stay float: only the two weight slots are active.
  std::size_t active = 0;
  for (const auto& s : qm.slots()) active += s.active() && qm.quant_slots().usable(s);
  EXPECT_EQ(active, 2u);

  const Graph g = qm.export_graph();
  int q = 0, dq = 0;
  for (const Node* n : g.nodes()) {
    q += n->op_type == "QuantizeLinear";
    dq += n->op_type == "DequantizeLinear";
  }
  EXPECT_EQ(q, 0);
  EXPECT_EQ(dq, 2) << "each layer keeps its own GPTQ integers of the shared weight";
  Executor ex(g, testing::shipped_registry());
  const at::Tensor from_export = ex.run({{"x", x}})[0];
  qm.set_quant(true, true);
  const at::Tensor simulated = qm.forward({x})[0];
  EXPECT_TRUE(at::allclose(from_export, simulated, 1e-5, 1e-5))
      << "max diff " << (from_export - simulated).abs().max().item<float>();
}

TEST(WeightOnly, ASpecificEntryTurnsActivationsOnForItsNodes) {
  const Config c = Config::from_string(R"(
[w]
bits = 8
[[specific]]
nodes = ["second"]
a = { bits = 8 }
)",
                                       "test.toml");
  EXPECT_TRUE(c.weight_only);
  EXPECT_TRUE(c.a.disable);
  ASSERT_EQ(c.specific.size(), 1u);
  EXPECT_FALSE(c.specific[0].a.disable);
  const Config both = Config::from_string("[w]\nbits = 8\n[a]\nbits = 8\n", "test.toml");
  EXPECT_FALSE(both.weight_only);
  EXPECT_FALSE(both.a.disable);
}

}  // namespace
}  // namespace sparsebit
