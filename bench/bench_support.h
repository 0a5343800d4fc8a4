#pragma once
// Shared by the benchmark programs: peak RSS of a phase and Fashion-MNIST top-1.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <fstream>
#include <string>

#include "sparsebit/core/quant_model.h"

namespace sparsebit::bench {

/// Where Debian's dataset-fashion-mnist package puts the IDX files.
inline const std::string kFashionMnist = "/usr/share/datasets/fashion-mnist";

/// Peak resident set size since the last reset_peak_rss() (VmHWM), in KiB.
inline long peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// Top-1 accuracy (%) of `qm` on images [N, 1, 28, 28] with quantization on or off, in eval mode.
inline double accuracy(QuantModel& qm, const at::Tensor& images, const at::Tensor& labels, bool quantized) {
  const bool was_training = qm.training();
  qm.eval();
  qm.set_quant(quantized, quantized);
  std::int64_t correct = 0;
  {
    c10::InferenceMode guard;
    for (std::int64_t i = 0; i < images.size(0); i += 500) {
      const std::int64_t n = std::min<std::int64_t>(500, images.size(0) - i);
      correct +=
          (qm.forward({images.narrow(0, i, n)})[0].argmax(1) == labels.narrow(0, i, n)).sum().item<std::int64_t>();
    }
  }
  qm.train(was_training);
  return 100.0 * double(correct) / double(images.size(0));
}

}  // namespace sparsebit::bench
