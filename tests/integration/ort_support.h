#pragma once
// What the ONNX Runtime agreement tests share: Q/DQ test models and data, running a model in
// ONNX Runtime, the bundled model calibrated, and the export-and-compare check (test_ort.cpp,
// test_ort_float8.cpp).

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/quant.h"
#include "test_support.h"

namespace sparsebit::ort_tests {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  bool symmetric;
  bool per_channel;
};

inline constexpr std::int64_t kChannels = 8;

// Random values across and beyond the range, plus exact ties (k + 0.5) * tie_scale.
inline at::Tensor qdq_input(double spread, double tie_scale) {
  return at::cat({at::randn({64, kChannels, 16}) * spread,
                  ((at::arange(-1024, 1024).to(at::kFloat) + 0.5) * tie_scale).reshape({16, kChannels, 16})},
                 0)
      .contiguous();
}

// x [N, kChannels, L] -> QuantizeLinear -> DequantizeLinear -> y (4-bit: int4/uint4 zero point).
inline Graph qdq_model(const QParams& p, const Case& c, int bits) {
  Graph g;
  g.opset_imports[""] = bits == 4 ? 21 : 13;
  const std::vector<Dim> shape{{-1, ""}, {kChannels, ""}, {-1, ""}};
  g.inputs.push_back({"x", 1, true, shape, ""});
  g.outputs.push_back({"y", 1, true, shape, ""});
  g.initializers["s"] = p.scale.to(at::kFloat);
  g.initializers["zp"] = p.zero_point.to(c.symmetric ? at::kChar : at::kByte);
  if (bits == 4) g.narrow_types["zp"] = c.symmetric ? 22 : 21;
  Node q, dq;
  q.name = "q";
  q.op_type = "QuantizeLinear";
  q.inputs = {"x", "s", "zp"};
  q.outputs = {"q"};
  dq.name = "dq";
  dq.op_type = "DequantizeLinear";
  dq.inputs = {"q", "s", "zp"};
  dq.outputs = {"y"};
  if (c.per_channel) {
    q.attributes["axis"] = Attribute::of_int(1);
    dq.attributes["axis"] = Attribute::of_int(1);
  }
  g.append(q);
  g.append(dq);
  return g;
}

// Runs `model` in ONNX Runtime on `x` (input `in`), returns output `out`.
inline at::Tensor run_in_ort(const std::string& model, const std::string& in, const at::Tensor& x,
                             const std::string& out, const testing::TempDir& dir, const std::string& level = "all") {
  write_npy(x, dir / "ort_in.npy");
  auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + model +
                                " --optimization " + level + " --in " + in + "=" + (dir / "ort_in.npy") + " --out " +
                                out + "=" + (dir / "ort_out.npy"));
  EXPECT_EQ(r.exit_code, 0) << model << "\n" << r.output;
  return r.exit_code == 0 ? read_npy(dir / "ort_out.npy") : at::Tensor();
}

// The bundled model calibrated under `c` on the first `count` training images.
inline std::unique_ptr<QuantModel> calibrated_fixture(Config c, int count) {
  c.calibration.count = count;
  auto qm = std::make_unique<QuantModel>(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm->graph().inputs);
  qm->calibrate(*data);
  return qm;
}

inline at::Tensor test_images(std::int64_t n) {
  return read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", n)
      .to(at::kFloat)
      .div(255)
      .unsqueeze(1);
}

// Exports `qm`, then checks our executor reproduces the simulation exactly and ONNX Runtime's
// reference kernels (no fusion, which would round float biases its own way) within `steps`
// output steps; returns the exported model.
inline Model check_export(QuantModel& qm, const std::string& path, const testing::TempDir& dir, double steps,
                          const std::string& what) {
  qm.export_onnx(path);
  Model exported = load_onnx(path);
  at::Tensor x = test_images(32);
  qm.set_quant(true, true);
  at::Tensor simulated = qm.forward({x})[0].detach();
  Executor ours(exported.graph, testing::shipped_registry());
  EXPECT_TRUE(at::allclose(ours.run({{"image", x}})[0], simulated, 1e-5, 1e-5)) << what;
  at::Tensor ort = run_in_ort(path, "image", x, "logits", dir, "disabled");
  if (ort.defined()) {
    const double step = 2 * simulated.abs().max().item<double>() / 255;
    EXPECT_LE((ort - simulated).abs().max().item<double>(), steps * step) << what;
  }
  return exported;
}

}  // namespace sparsebit::ort_tests
