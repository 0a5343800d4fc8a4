// W4A4 quantization-aware training against post-training quantization on a Fashion-MNIST
// classifier, as a Markdown table (docs/ACCURACY.md).
//
//   qat_bench MODEL.onnx [--config configs/w4a4_lsq.toml] [--epochs 2] [--train-count 60000]
//             [--eval-count 10000] [--threads N]
//
// Every row uses the config's scheme (W4A4 LSQ, first and last layer 8-bit): PTQ round to
// nearest (the calibrated starting point), PTQ AdaRound (asym, 2000 steps per layer, lr 1e-2),
// QAT with labels (cross-entropy, shuffled, Adam at [qat] lr, batch 64) and label-free QAT
// (sparsebit::distill, MSE to the float model's logits, same lr and batch, data in order).
// Calibration: the first [calibration] count training images. Reports test top-1, wall time and
// peak RSS of each row (VmHWM, reset through /proc/self/clear_refs).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "sparsebit/core/qat.h"
#include "bench_support.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;
using sb::bench::accuracy;
using sb::bench::kFashionMnist;
using sb::bench::peak_rss_kib;
using sb::bench::reset_peak_rss;

namespace {

sb::Config with_adaround(sb::Config c) {
  auto adaround = [](sb::QuantTableConfig& t) {
    t.quantizer = "adaround";
    t.quantizer_options = sb::Options("[w.quantizer_options]");
    t.quantizer_options.set("iterations", std::int64_t{2000});
    t.quantizer_options.set("learning_rate", 1e-2);
  };
  adaround(c.w);
  for (auto& e : c.specific) adaround(e.w);
  c.calibration.mode = "asym";
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL.onnx [--config C] [--epochs N] [--train-count N] [--eval-count N] [--threads T]\n",
                 argv[0]);
    return 2;
  }
  const std::string model = argv[1];
  std::string config_path = std::string(SPARSEBIT_SOURCE_DIR) + "/configs/w4a4_lsq.toml";
  int epochs = 2;
  std::int64_t train_count = 60000, eval_count = 10000;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") config_path = v;
    else if (k == "--epochs") epochs = std::stoi(v);
    else if (k == "--train-count") train_count = std::stoll(v);
    else if (k == "--eval-count") eval_count = std::stoll(v);
    else if (k == "--threads") at::set_num_threads(std::stoi(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  sb::sdk::set_log_level(sb::sdk::LogLevel::kWarn);
  try {
    sb::Config config = sb::Config::from_file(config_path);
    config.plugins.use_environment = false;
    config.qat.epochs = epochs;
    config.qat.count = static_cast<int>(train_count);
    sb::Registry registry;
    registry.load(config.plugins);
    const at::Tensor test_x =
        sb::read_idx(kFashionMnist + "/t10k-images-idx3-ubyte.gz", eval_count).to(at::kFloat).div(255).unsqueeze(1);
    const at::Tensor test_y = sb::read_idx(kFashionMnist + "/t10k-labels-idx1-ubyte.gz", eval_count).to(at::kLong);
    const at::Tensor train_x =
        sb::read_idx(kFashionMnist + "/train-images-idx3-ubyte.gz", train_count).to(at::kFloat).div(255).unsqueeze(1);
    const at::Tensor train_y = sb::read_idx(kFashionMnist + "/train-labels-idx1-ubyte.gz", train_count).to(at::kLong);
    std::printf(
        "model: %s\nconfig: %s; %d epoch(s) of %lld training images, Adam lr %g, batch %d; %lld test images, %d "
        "intra-op threads\n\n",
        model.c_str(), config_path.c_str(), epochs, static_cast<long long>(train_x.size(0)), config.qat.lr,
        config.qat.batch_size, static_cast<long long>(test_x.size(0)), at::get_num_threads());
    std::printf("| scheme | top-1 | vs FP32 | wall s | peak RSS MiB |\n|---|---|---|---|---|\n");
    double fp32 = 0;
    auto row = [&](const std::string& name, const sb::Config& c, const std::function<void(sb::QuantModel&)>& train) {
      reset_peak_rss();
      const auto t0 = std::chrono::steady_clock::now();
      sb::QuantModel qm(sb::load_onnx(model), c, registry);
      auto calib = sb::open_dataset(kFashionMnist + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
      qm.init_qat(*calib);
      if (train) train(qm);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double top1 = accuracy(qm, test_x, test_y, true);
      std::printf("| %s | %.2f%% | %+.2f | %.0f | %.0f |\n", name.c_str(), top1, top1 - fp32, secs,
                  double(peak_rss_kib()) / 1024);
      std::fflush(stdout);
    };
    {
      sb::QuantModel qm(sb::load_onnx(model), config, registry);
      fp32 = accuracy(qm, test_x, test_y, false);
      std::printf("| FP32 | %.2f%% | - | - | - |\n", fp32);
    }
    row("W4A4 PTQ, round to nearest", config, {});
    row("W4A4 PTQ, AdaRound (asym)", with_adaround(config), {});
    row("W4A4 QAT, labels (cross-entropy)", config, [&](sb::QuantModel& qm) {
      torch::optim::Adam adam(qm.parameters(), torch::optim::AdamOptions(config.qat.lr));
      const std::int64_t batch = config.qat.batch_size;
      for (int epoch = 1; epoch <= epochs; ++epoch) {
        at::manual_seed(epoch);
        const at::Tensor order = at::randperm(train_x.size(0));
        for (std::int64_t i = 0; i < train_x.size(0); i += batch) {
          const at::Tensor idx = order.narrow(0, i, std::min(batch, train_x.size(0) - i));
          at::Tensor loss =
              at::cross_entropy_loss(qm.forward({train_x.index_select(0, idx)})[0], train_y.index_select(0, idx));
          adam.zero_grad();
          loss.backward();
          adam.step();
        }
      }
    });
    row("W4A4 QAT, label-free distillation (MSE)", config, [&](sb::QuantModel& qm) {
      sb::Model float_model = sb::load_onnx(model);
      sb::Executor teacher(float_model.graph, registry);
      sb::distill(qm, teacher,
                  [&] { return sb::open_dataset(kFashionMnist + "/train-images-idx3-ubyte.gz", qm.graph().inputs); },
                  {config.qat, "", ""});
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
