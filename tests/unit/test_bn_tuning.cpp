// BatchNorm re-estimation (a pipeline step of the core, Note [Pipeline order]).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pass_testing.h"

#include "sparsebit/core/bn_tuning.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

// The first BatchNormalization of the opset-9 fixture has no BN upstream, so its tuned
// statistics must equal the plain mean / biased variance of its input with every quantizer on,
// computed here independently through QuantModel::forward.
TEST(BnTuning, FirstBatchNormGetsTheQuantizedInputStatistics) {
  TempDir work;
  at::manual_seed(0);
  const at::Tensor data = at::randn({24, 3, 16, 16}) * 2 + 0.5;
  write_npy(data, work / "calib.npy");
  Config config = Config::from_string(
      "backend = \"virtual\"\n[schedule]\nbn_tuning = true\n[calibration]\nbatch_size = 8\n", "bn.toml");
  ASSERT_TRUE(bn_tuning_enabled(config));
  Model model = load_onnx(source_path("tests/fixtures/opset9_cnn.onnx"));
  const Node* bn = nullptr;
  for (const Node* n : model.graph.nodes())
    if (n->op_type == "BatchNormalization" && !bn) bn = n;
  ASSERT_NE(bn, nullptr);
  const std::string bn_input = bn->inputs[0], mean_name = bn->inputs[3], var_name = bn->inputs[4];

  Model tuned = tune_batchnorm(model, config, shipped_registry(), work / "calib.npy");

  Config unfused = config;
  unfused.passes.switches["fuse_bn"] = false;
  QuantModel qm(Model{model.graph.clone(), model.meta}, unfused, shipped_registry());
  auto calib = open_dataset(work / "calib.npy", qm.graph().inputs);
  qm.calibrate(*calib);
  qm.set_quant(true, true);
  at::Tensor seen;
  qm.forward({data}, [&](const std::string& name, const at::Tensor& x) {
    if (name == bn_input && !seen.defined()) seen = x.to(at::kDouble);
  });
  ASSERT_TRUE(seen.defined());
  const at::Tensor mean = seen.mean({0, 2, 3}), var = seen.var({0, 2, 3}, /*unbiased=*/false);
  EXPECT_TRUE(at::allclose(tuned.graph.initializers.at(mean_name).to(at::kDouble), mean, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(tuned.graph.initializers.at(var_name).to(at::kDouble), var, 1e-5, 1e-6));
  EXPECT_FALSE(at::allclose(model.graph.initializers.at(mean_name).to(at::kDouble), mean, 1e-3, 1e-4))
      << "the fixture's own statistics differ, so the test can tell";
  // The tuned model converts as usual: fuse_bn folds the tuned statistics into the conv.
  QuantModel folded(std::move(tuned), config, shipped_registry());
  for (const Node* n : folded.graph().nodes()) EXPECT_NE(n->op_type, "BatchNormalization");
}

}  // namespace
}  // namespace sparsebit::testing
