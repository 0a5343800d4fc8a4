// Low-bit weight accuracy: round to nearest, AdaRound (layerwise and asym), bias correction
// and cross-layer equalization on a Fashion-MNIST classifier, as a Markdown table (the tables
// in docs/ACCURACY.md are its output).
//
//   adaround_bench MODEL.onnx [--calib-count 1024] [--iterations 2000] [--eval-count 10000]
//                  [--threads N] [--rows SUBSTRING] [--require-gain]
//
// Each row builds the model from a config (virtual backend; weights per-channel symmetric
// minmax, activations per-tensor affine minmax, MSE at 4 bits), calibrates on the first N training images
// (batch 64) and reports test-set top-1, the wall time of calibration (including AdaRound)
// and the process's peak RSS during the row (VmHWM, reset through /proc/self/clear_refs).
// AdaRound runs `--iterations` steps per layer with batch 32, learning rate 1e-2.
// --require-gain exits 1 unless W4A8 AdaRound (asym) beats W4A8 round to nearest.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_support.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;
using sb::bench::accuracy;
using sb::bench::kFashionMnist;
using sb::bench::peak_rss_kib;
using sb::bench::reset_peak_rss;

namespace {

struct Row {
  std::string name;
  int wbits = 32, abits = 32;
  std::string quantizer = "uniform";
  std::string mode = "streaming";
  bool bias_correction = false, equalization = false;
};

std::string config_text(const Row& r, int count, int iterations) {
  std::string t = "backend = \"virtual\"\n";
  t += "[w]\nqscheme = \"per-channel-symmetric\"\nbits = " + std::to_string(r.wbits) + "\nquantizer = \"" +
       r.quantizer + "\"\n";
  if (r.quantizer == "adaround") {
    t += "[w.quantizer_options]\niterations = " + std::to_string(iterations) + "\nlearning_rate = 1e-2\n";
  }
  // 4-bit activations use the MSE observer, as configs/w4a4_adaround.toml does.
  t += "[a]\nqscheme = \"per-tensor-affine\"\nbits = " + std::to_string(r.abits) + "\nobserver = \"" +
       (r.abits <= 4 ? "mse" : "minmax") + "\"\n";
  t += "[calibration]\nbatch_size = 64\ncount = " + std::to_string(count) + "\nmode = \"" + r.mode + "\"\n";
  t += "[schedule]\nbias_correction = " + std::string(r.bias_correction ? "true" : "false") + "\n";
  t += "cross_layer_equalization = " + std::string(r.equalization ? "true" : "false") + "\n";
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL.onnx [--calib-count N] [--iterations N] [--eval-count N] [--threads T] [--rows S] "
                 "[--require-gain]\n",
                 argv[0]);
    return 2;
  }
  const std::string model = argv[1];
  int count = 1024, iterations = 2000;
  std::int64_t eval_count = 10000;
  std::string only;
  bool require_gain = false;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--require-gain") {
      require_gain = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (k == "--calib-count") count = std::stoi(v);
    else if (k == "--iterations") iterations = std::stoi(v);
    else if (k == "--eval-count") eval_count = std::stoll(v);
    else if (k == "--threads") at::set_num_threads(std::stoi(v));
    else if (k == "--rows") only = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  sb::sdk::set_log_level(sb::sdk::LogLevel::kWarn);
  const std::vector<Row> rows = {
      {"FP32", 32, 32},
      {"W8A8 round to nearest", 8, 8},
      {"W4A8 round to nearest", 4, 8},
      {"W4A8 round to nearest + bias correction", 4, 8, "uniform", "asym", true},
      {"W4A8 round to nearest + equalization", 4, 8, "uniform", "streaming", false, true},
      {"W4A8 AdaRound layerwise", 4, 8, "adaround", "layerwise"},
      {"W4A8 AdaRound asym", 4, 8, "adaround", "asym"},
      {"W4A8 AdaRound asym + bias correction", 4, 8, "adaround", "asym", true},
      {"W4A8 AdaRound asym + equalization", 4, 8, "adaround", "asym", false, true},
      {"W4A4 round to nearest", 4, 4},
      {"W4A4 round to nearest + bias correction", 4, 4, "uniform", "asym", true},
      {"W4A4 AdaRound asym", 4, 4, "adaround", "asym"},
      {"W4A4 AdaRound asym + bias correction", 4, 4, "adaround", "asym", true},
      {"W4A4 AdaRound asym + equalization", 4, 4, "adaround", "asym", false, true},
  };
  try {
    sb::Registry registry;
    registry.load({});
    at::Tensor images =
        sb::read_idx(kFashionMnist + "/t10k-images-idx3-ubyte.gz", eval_count).to(at::kFloat).div(255).unsqueeze(1);
    at::Tensor labels = sb::read_idx(kFashionMnist + "/t10k-labels-idx1-ubyte.gz", eval_count).to(at::kLong);
    std::printf(
        "model: %s\n%d calibration images, AdaRound %d steps per layer, %lld test images, %d intra-op threads\n\n",
        model.c_str(), count, iterations, static_cast<long long>(images.size(0)), at::get_num_threads());
    std::printf("| scheme | top-1 | vs FP32 | calibration s | peak RSS MiB |\n|---|---|---|---|---|\n");
    double fp32 = 0, rtn_w4a8 = -1, ada_w4a8 = -1;
    for (const auto& r : rows) {
      if (!only.empty() && r.name.find(only) == std::string::npos && r.name != "FP32") continue;
      reset_peak_rss();
      const bool quantized = r.wbits < 32;
      sb::Config c = sb::Config::from_string(config_text(quantized ? r : Row{"", 8, 8}, count, iterations), r.name);
      c.plugins.use_environment = false;
      sb::QuantModel qm(sb::load_onnx(model), c, registry);
      double secs = 0;
      if (quantized) {
        auto data = sb::open_dataset(kFashionMnist + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
        const auto t0 = std::chrono::steady_clock::now();
        qm.calibrate(*data);
        secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      const double top1 = accuracy(qm, images, labels, quantized);
      if (!quantized) fp32 = top1;
      if (r.name == "W4A8 round to nearest") rtn_w4a8 = top1;
      if (r.name == "W4A8 AdaRound asym") ada_w4a8 = top1;
      const double rss = double(peak_rss_kib()) / 1024;
      if (quantized) {
        std::printf("| %s | %.2f%% | %+.2f | %.1f | %.0f |\n", r.name.c_str(), top1, top1 - fp32, secs, rss);
      } else {
        std::printf("| %s | %.2f%% | - | - | %.0f |\n", r.name.c_str(), top1, rss);
      }
      std::fflush(stdout);
    }
    if (require_gain && !(ada_w4a8 > rtn_w4a8)) {
      std::fprintf(stderr, "W4A8 AdaRound asym (%.2f%%) does not beat round to nearest (%.2f%%)\n", ada_w4a8, rtn_w4a8);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
