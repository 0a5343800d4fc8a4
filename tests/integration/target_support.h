#pragma once
// What the accuracy-target tests share: the bundled classifier calibrated with two layers
// sabotaged, a target from an expression, the held-out cosine measured outside the search
// (test_target.cpp, test_target_metrics.cpp).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "quant/target_search.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit::target_tests {

inline const std::string kImages = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";

// W8A8 on the virtual backend, with two layers sabotaged to 2-bit weights: the layers a
// fallback search must find.
inline const char* kSabotaged = R"(backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
[calibration]
count = 128
[[specific]]
nodes = ["/dw3/Conv", "/fc1/Gemm"]
w = { bits = 2 }
)";

struct Fixture {
  QuantModel qm;
  TargetData data;
};

inline Fixture calibrated(const std::string& config_text, std::int64_t holdout = 16) {
  Fixture f{QuantModel(load_onnx(testing::fixture_model()), Config::from_string(config_text, "target.toml"),
                       testing::shipped_registry()),
            {}};
  const auto& inputs = f.qm.graph().inputs;
  f.data.calibration = DataSource("images after the first 1000", [](const std::vector<ValueInfo>& in) {
    return std::unique_ptr<Dataset>(new SampleWindow(open_dataset(kImages, in), in, 1000, 0));
  });
  f.qm.calibrate(*f.data.calibration.open(inputs));
  SampleWindow held(open_dataset(kImages, inputs), inputs, 0, holdout);
  Batcher one(held, inputs, 1, 0);
  while (auto b = one.next()) f.data.holdout.push_back(b->inputs);
  f.data.holdout_description = "test holdout";
  f.data.range_observer = testing::shipped_registry().observer("auto")->factory;
  return f;
}

inline TargetConfig target(const std::string& expression, std::vector<std::string> fallback, std::int64_t budget) {
  TargetConfig t;
  t.parse_expression(expression, "test");
  t.fallback = std::move(fallback);
  t.max_fallback_layers = budget;
  return t;
}

// The cosine with exactly `floats` unquantized, measured independently of the search.
inline double worst_cosine_with(QuantModel& qm, const TargetData& d, const std::set<std::string>& floats) {
  for (const auto& n : floats) qm.set_enabled(n, false);
  double worst = 1;
  for (const auto& x : d.holdout) {
    qm.set_quant(false, false);
    at::Tensor f = qm.forward(x)[0].to(at::kDouble).reshape({-1});
    qm.set_quant(true, true);
    at::Tensor q = qm.forward(x)[0].to(at::kDouble).reshape({-1});
    worst = std::min(
        worst, (f * q).sum().item<double>() / std::sqrt(f.pow(2).sum().item<double>() * q.pow(2).sum().item<double>()));
  }
  qm.set_quant(false, false);
  for (const auto& n : floats) qm.set_enabled(n, true);
  return worst;
}

}  // namespace sparsebit::target_tests
