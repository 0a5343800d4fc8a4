// Accuracy of a Fashion-MNIST classifier under the shipped observers and bit widths, as a
// Markdown table (docs/ACCURACY.md is its output):
//   accuracy_table MODEL.onnx [--calib-count 512] [--threads N] [--observers a,b,...]
// Rows: FP32; W8A8 with each activation observer (weights: per-channel symmetric minmax);
// W4A8 and W4A4 with round-to-nearest (uniform quantizer, minmax). Activations are per-tensor
// affine, the virtual backend (simulation), calibration on the first N training images,
// evaluation on the 10,000 test images. --observers keeps only the rows of those observers.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_support.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;
using sb::bench::accuracy;
using sb::bench::kFashionMnist;

namespace {

struct Row {
  std::string name;
  int wbits, abits;
  std::string observer;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.onnx [--calib-count N] [--threads T] [--observers a,b,...]\n", argv[0]);
    return 2;
  }
  const std::string model = argv[1];
  int count = 512;
  std::string only;  // ",a,b," when --observers is given
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--calib-count") count = std::stoi(argv[i + 1]);
    else if (k == "--threads") at::set_num_threads(std::stoi(argv[i + 1]));
    else if (k == "--observers") only = "," + std::string(argv[i + 1]) + ",";
  }
  sb::sdk::set_log_level(sb::sdk::LogLevel::kWarn);
  try {
    sb::Registry registry;
    registry.load({});
    at::Tensor images = sb::read_idx(kFashionMnist + "/t10k-images-idx3-ubyte.gz").to(at::kFloat).div(255).unsqueeze(1);
    at::Tensor labels = sb::read_idx(kFashionMnist + "/t10k-labels-idx1-ubyte.gz").to(at::kLong);
    const std::vector<Row> rows = {
        {"W8A8", 8, 8, "minmax"},         {"W8A8", 8, 8, "percentile"},   {"W8A8", 8, 8, "mse"},
        {"W8A8", 8, 8, "moving_average"}, {"W8A8", 8, 8, "kl_histogram"}, {"W8A8", 8, 8, "aciq"},
        {"W4A8", 4, 8, "minmax"},         {"W4A4", 4, 4, "minmax"},       {"W4A4", 4, 4, "mse"},
    };
    std::printf("model: %s (%d calibration images, %d intra-op threads)\n\n", model.c_str(), count,
                at::get_num_threads());
    std::printf("| scheme | activation observer | top-1 | vs FP32 | calibration s |\n|---|---|---|---|---|\n");
    bool fp32_printed = false;
    for (const auto& r : rows) {
      if (!only.empty() && only.find("," + r.observer + ",") == std::string::npos) continue;
      sb::Config c;
      c.backend = "virtual";
      c.w.bits = r.wbits;
      c.a.bits = r.abits;
      c.a.qscheme = "per-tensor-affine";
      c.a.observer = r.observer;
      c.calibration.count = count;
      c.calibration.batch_size = 64;
      c.plugins.use_environment = false;
      sb::QuantModel qm(sb::load_onnx(model), c, registry);
      auto data = sb::open_dataset(kFashionMnist + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
      const auto t0 = std::chrono::steady_clock::now();
      qm.calibrate(*data);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      static double fp32 = 0;
      if (!fp32_printed) {
        fp32 = accuracy(qm, images, labels, false);
        std::printf("| FP32 | - | %.2f%% | - | - |\n", fp32);
        fp32_printed = true;
      }
      const double q = accuracy(qm, images, labels, true);
      std::printf("| %s | %s | %.2f%% | %+.2f | %.2f |\n", r.name.c_str(), r.observer.c_str(), q, q - fp32, secs);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
