// Calibration cost against the float forward pass it is built on.
//
//   calibration_bench MODEL.onnx CONFIG.toml [--samples 256] [--batch 32] [--threads N]
//                     [--mode streaming|layerwise] [--repeat 3]
//
// Prints, for the same random input set (uniform [0,1), the model's input shape): the FP32
// forward time over all samples with LibTorch (our executor, no hooks), the calibration time
// (forward + observers + parameter computation), their ratio, and the peak RSS of each phase
// (VmHWM, reset between phases through /proc/self/clear_refs).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_support.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;
using sb::bench::peak_rss_kib;
using sb::bench::reset_peak_rss;

namespace {

class MemoryDataset final : public sb::Dataset {
 public:
  explicit MemoryDataset(const std::vector<at::Tensor>& batches) : batches_(batches) {}
  std::string describe() const override { return "random batches"; }
  std::optional<std::int64_t> num_samples() const override { return std::nullopt; }
  std::optional<sb::Batch> next() override {
    if (pos_ >= batches_.size()) return std::nullopt;
    return sb::Batch{{batches_[pos_++]}, "memory", true};
  }

 private:
  const std::vector<at::Tensor>& batches_;
  std::size_t pos_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s MODEL.onnx CONFIG.toml [--samples N] [--batch B] [--threads T] [--mode M] [--repeat R]\n",
                 argv[0]);
    return 2;
  }
  std::string model_path = argv[1], config_path = argv[2], mode = "streaming";
  int samples = 256, batch = 32, threads = 0, repeat = 3;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--samples") samples = std::stoi(v);
    else if (k == "--batch") batch = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--mode") mode = v;
    else if (k == "--repeat") repeat = std::stoi(v);
  }
  if (threads > 0) at::set_num_threads(threads);
  sb::sdk::set_log_level(sb::sdk::LogLevel::kWarn);
  try {
    sb::Config config = sb::Config::from_file(config_path);
    config.calibration.count = samples;
    config.calibration.batch_size = batch;
    config.calibration.mode = mode;
    sb::Registry registry;
    registry.load(config.plugins);
    sb::QuantModel qm(sb::load_onnx(model_path), config, registry);

    const auto& in = qm.graph().inputs.at(0);
    std::vector<std::int64_t> shape{batch};
    for (std::size_t d = 1; d < in.shape.size(); ++d) shape.push_back(in.shape[d].value > 0 ? in.shape[d].value : 1);
    at::manual_seed(0);
    std::vector<at::Tensor> batches;
    for (int done = 0; done < samples; done += batch) {
      shape[0] = std::min(batch, samples - done);
      batches.push_back(at::rand(shape));
    }

    std::vector<double> fp32, calib;
    long rss_fp32 = 0, rss_calib = 0;
    for (int r = 0; r < repeat; ++r) {
      reset_peak_rss();
      {
        c10::InferenceMode guard;
        auto t0 = std::chrono::steady_clock::now();
        for (const auto& b : batches) qm.forward({b});
        fp32.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      rss_fp32 = std::max(rss_fp32, peak_rss_kib());
      reset_peak_rss();
      MemoryDataset data(batches);
      auto t0 = std::chrono::steady_clock::now();
      qm.calibrate(data);
      calib.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      rss_calib = std::max(rss_calib, peak_rss_kib());
    }
    const double f = median(fp32), c = median(calib);
    std::size_t active = 0;
    for (const auto& s : qm.slots()) active += !s.fake_fused;
    std::printf(
        "model %s: %d samples, batch %d, %s calibration, %zu quantized tensors, %d intra-op threads (LibTorch)\n",
        model_path.c_str(), samples, batch, mode.c_str(), active, at::get_num_threads());
    std::printf("  FP32 forward (LibTorch)  %8.3f s   peak RSS %7.1f MiB\n", f, rss_fp32 / 1024.0);
    std::printf("  calibration              %8.3f s   peak RSS %7.1f MiB\n", c, rss_calib / 1024.0);
    std::printf("  ratio calibration/FP32   %8.3f     (target <= 1.30; median of %d runs)\n", c / f, repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
