#pragma once
// What the pipeline tests share: the bundled model's calibration images, a shipped config with
// the run's count and mode, a calibrated QuantModel, a test batch (test_pipeline.cpp,
// test_pipeline_control_flow.cpp).

#include <ATen/ATen.h>

#include <string>

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/onnx_io.h"
#include "test_support.h"

namespace sparsebit::pipeline_tests {

inline const std::string kImages = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";

inline Config config_for(const std::string& backend_config, int count = 128, const std::string& mode = "streaming") {
  Config c = Config::from_file(testing::source_path("configs/" + backend_config));
  c.calibration.count = count;
  c.calibration.mode = mode;
  c.latency.search = false;  // a timing choice: jobs compared here would not be alike
  return c;
}

inline QuantModel calibrated(const Config& c) {
  QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  auto data = open_dataset(kImages, qm.graph().inputs);
  qm.calibrate(*data);
  return qm;
}

inline at::Tensor test_batch(std::int64_t n) {
  return read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", n)
      .to(at::kFloat)
      .div(255)
      .unsqueeze(1);
}

}  // namespace sparsebit::pipeline_tests
