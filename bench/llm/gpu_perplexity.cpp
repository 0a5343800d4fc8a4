// Held-out perplexity of a byte-level language model run by Sparsebit's executor, on the GPU (or
// the CPU): the same windows and arithmetic as ort_perplexity.mjs (positions 0..T-2 predict
// tokens 1..T-1, log-softmax in float64), so an exported model's figure here is compared with ONNX
// Runtime's on the CPU. MatMulNBits weights run through the CUDA plugin's 4-bit kernels (Note
// [MatMulNBits kernels]); --no-kernels runs the ATen reference (dequantize, then matmul) instead.
//
//   gpu_perplexity MODEL.onnx EVAL_DIR [--device cuda] [--batch 32] [--no-kernels]
//
// Prints {"model", "windows", "perplexity", "seconds", "device"} as JSON.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/kernels.h"

int main(int argc, char** argv) {
  using namespace sparsebit;
  std::vector<std::string> positional;
  std::string device = "cuda";
  std::int64_t batch = 32;
  bool kernels = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batch = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--no-kernels")) kernels = false;
    else positional.push_back(argv[i]);
  }
  if (positional.size() != 2) {
    std::fprintf(stderr, "usage: gpu_perplexity MODEL.onnx EVAL_DIR [--device cuda] [--batch N] [--no-kernels]\n");
    return 2;
  }
  try {
    Registry registry;
    registry.load({});
    use_device_kernels(kernels);
    Model model = load_onnx(positional[0]);
    Executor executor(model.graph, registry);
    executor.to(device);
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(positional[1]))
      if (e.path().extension() == ".npy") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw Error(positional[1] + ": no .npy windows");
    c10::InferenceMode guard;
    const auto start = std::chrono::steady_clock::now();
    double nll = 0;
    std::int64_t count = 0;
    const std::string input = model.graph.inputs.at(0).name;
    for (std::size_t s = 0; s < files.size(); s += static_cast<std::size_t>(batch)) {
      std::vector<at::Tensor> windows;
      for (std::size_t i = s; i < std::min(files.size(), s + static_cast<std::size_t>(batch)); ++i)
        windows.push_back(read_npy(files[i]).to(at::kLong).reshape({-1}));
      const at::Tensor tokens = at::stack(windows);  // [B, T]
      const at::Tensor logits = executor.run({{input, tokens.to(device)}})[0].to(at::kCPU, at::kDouble);
      const std::int64_t t = tokens.size(1);
      const at::Tensor logp = at::log_softmax(logits.slice(1, 0, t - 1), -1);
      nll -= logp.gather(2, tokens.slice(1, 1, t).unsqueeze(2)).sum().item<double>();
      count += tokens.size(0) * (t - 1);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("{\"model\": \"%s\", \"windows\": %zu, \"perplexity\": %.8f, \"seconds\": %.3f, \"device\": \"%s\"}\n",
                positional[0].c_str(), files.size(), std::exp(nll / double(count)), seconds, device.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_perplexity: %s\n", e.what());
    return 1;
  }
  return 0;
}
