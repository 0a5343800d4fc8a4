// Held-out perplexity of a byte-level language model run by Sparsebit's executor, on the GPU (or
// the CPU): the same windows and arithmetic as ort_perplexity.mjs (positions 0..T-2 predict
// tokens 1..T-1, log-softmax in float64), so an exported model's figure here is compared with ONNX
// Runtime's on the CPU. MatMulNBits weights run through the CUDA plugin's 4-bit kernels (Note
// [MatMulNBits kernels]); --no-kernels runs the ATen reference (dequantize, then matmul) instead.
//
// --dtype float16 runs the model in half precision (its float constants cast, so activations and
// MatMulNBits scales are float16, as a float16 deployment runs them). --decode N then times a
// greedy decode at batch 1: the first 16 bytes of the first window as the prompt, N bytes
// generated one model run each (no KV cache in these exports: a model with a dynamic length
// runs the tokens it has, one of fixed length the whole window, padded after them).
//
//   gpu_perplexity MODEL.onnx EVAL_DIR [--device cuda] [--batch 32] [--no-kernels]
//                  [--dtype float32|float16] [--decode N]
//
// Prints {"model", "windows", "perplexity", "seconds", "device", "dtype"} as JSON, with --decode
// also "decode": {"tokens", "tokens_per_s", "rows", "ids"}.

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
  std::string dtype = "float32";
  std::int64_t decode = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batch = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--no-kernels")) kernels = false;
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (!std::strcmp(argv[i], "--decode") && i + 1 < argc) decode = std::max(0, std::atoi(argv[++i]));
    else positional.push_back(argv[i]);
  }
  if (positional.size() != 2) {
    std::fprintf(stderr,
                 "usage: gpu_perplexity MODEL.onnx EVAL_DIR [--device cuda] [--batch N] [--no-kernels] "
                 "[--dtype float32|float16] [--decode N]\n");
    return 2;
  }
  if (dtype != "float32" && dtype != "float16") {
    std::fprintf(stderr, "gpu_perplexity: --dtype is float32 or float16, not %s\n", dtype.c_str());
    return 2;
  }
  try {
    Registry registry;
    registry.load({});
    use_device_kernels(kernels);
    Model model = load_onnx(positional[0]);
    // A float16 model declares float16 outputs, as a float16 export does; the executor holds the
    // graph to its declarations.
    if (dtype == "float16")
      for (ValueInfo& v : model.graph.outputs)
        if (v.elem_type == onnx_type_of(at::kFloat)) v.elem_type = onnx_type_of(at::kHalf);
    Executor executor(model.graph, registry);
    executor.to(device);
    if (dtype == "float16") {
      std::vector<std::pair<std::string, at::Tensor>> halves;
      for (const auto& [name, t] : executor.constants())
        if (t.scalar_type() == at::kFloat) halves.emplace_back(name, t.to(at::kHalf));
      for (auto& [name, t] : halves) executor.set_constant(name, std::move(t));
    }
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
    std::printf(
        "{\"model\": \"%s\", \"windows\": %zu, \"perplexity\": %.8f, \"seconds\": %.3f, \"device\": \"%s\", "
        "\"dtype\": \"%s\"",
        positional[0].c_str(), files.size(), std::exp(nll / double(count)), seconds, device.c_str(), dtype.c_str());
    if (decode > 0) {
      const at::Tensor first = read_npy(files[0]).to(at::kLong).reshape({-1});
      const Dim& length = model.graph.inputs.at(0).shape.at(1);
      const bool fixed = length.value > 0;
      const std::int64_t window = fixed ? length.value : first.size(0), prompt = 16;
      std::vector<std::int64_t> ids(first.data_ptr<std::int64_t>(), first.data_ptr<std::int64_t>() + prompt);
      const std::int64_t steps = std::min(decode, window - prompt), warmup = 2;
      auto step = [&] {  // one byte: the model over what is there, the largest logit at the last position
        const auto n = static_cast<std::int64_t>(ids.size());
        at::Tensor x = at::zeros({1, fixed ? window : n}, at::kLong);
        std::copy(ids.begin(), ids.end(), x.data_ptr<std::int64_t>());
        const at::Tensor logits = executor.run({{input, x.to(device)}})[0];
        ids.push_back(logits.select(1, n - 1).argmax(-1).item<std::int64_t>());  // .item() waits for the GPU
      };
      for (std::int64_t i = 0; i < warmup; ++i) step();
      ids.resize(static_cast<std::size_t>(prompt));
      const auto t0 = std::chrono::steady_clock::now();
      for (std::int64_t i = 0; i < steps; ++i) step();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf(", \"decode\": {\"tokens\": %lld, \"tokens_per_s\": %.2f, \"rows\": \"%s\", \"ids\": [",
                  static_cast<long long>(steps), double(steps) / s, fixed ? "window" : "prefix");
      for (std::size_t i = static_cast<std::size_t>(prompt); i < ids.size(); ++i)
        std::printf("%s%lld", i == static_cast<std::size_t>(prompt) ? "" : ", ", static_cast<long long>(ids[i]));
      std::printf("]}");
    }
    std::printf("}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_perplexity: %s\n", e.what());
    return 1;
  }
  return 0;
}
