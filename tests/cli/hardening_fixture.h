#pragma once
// The Hardening tests' fixture: a model, a config and the calibration images in a scratch folder,
// and the checks the tests share (test_hardening.cpp, test_hardening_models.cpp,
// test_hardening_numbers.cpp).

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit::hardening {

namespace fs = std::filesystem;
using testing::run_cli;

inline const std::string kImages = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";

class Hardening : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = (work_.path() / "m.onnx").string();
    fs::copy_file(testing::fixture_model(), model_);
    config_ = (work_.path() / "c.toml").string();
    fs::copy_file(testing::source_path("configs/w8a8_tensorrt.toml"), config_);
  }
  std::string quantize(const std::string& extra) {
    return "quantize " + model_ + " -c " + config_ + " --calib " + kImages + " --calib-count 64 " + extra;
  }
  // Exit status 1 and one error line holding every needle (besides the run's info/warning lines).
  void expect_one_line_error(const testing::CommandResult& r, const std::vector<std::string>& needles) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    std::stringstream lines(r.output);
    std::string error;
    int errors = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("error", 0) == 0) {
        ++errors;
        error = line;
      }
    }
    EXPECT_EQ(errors, 1) << r.output;
    for (const auto& n : needles)
      EXPECT_NE(error.find(n), std::string::npos) << "missing '" << n << "' in " << r.output;
  }
  // x [N, 16] -> Gemm `first` -> Relu -> Gemm -> y [N, 8], every tensor of `type`; its path.
  std::string two_gemms(const std::string& file, const std::string& first, at::ScalarType type) {
    const std::int32_t onnx_type = type == at::kDouble ? 11 : type == at::kHalf ? 10 : 1;
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs = {{"x", onnx_type, true, {{-1, "N"}, {16, ""}}, ""}};
    g.outputs = {{"y", onnx_type, true, {{-1, "N"}, {8, ""}}, ""}};
    g.initializers["w1"] = at::randn({16, 16}, type);
    g.initializers["w2"] = at::randn({8, 16}, type);
    g.append(testing::make_node(first, "Gemm", {"x", "w1"}, {"h"}, {{"transB", Attribute::of_int(1)}}));
    g.append(testing::make_node("relu", "Relu", {"h"}, {"r"}));
    g.append(testing::make_node("fc2", "Gemm", {"r", "w2"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
    const std::string path = (work_.path() / file).string();
    save_onnx(g, ModelMeta{}, path);
    return path;
  }
  // A folder of four samples [16] of `type`.
  fs::path samples(at::ScalarType type) {
    const fs::path data = work_.path() / "data";
    fs::create_directories(data);
    for (int i = 0; i < 4; ++i) write_npy(at::randn({16}, type), (data / ("s" + std::to_string(i) + ".npy")).string());
    return data;
  }
  testing::TempDir work_;
  std::string model_, config_;
};

}  // namespace sparsebit::hardening
