// Quantization-aware training with labels, as a LibTorch training loop written against the
// Sparsebit library: calibrate, init_qat(), then Adam on cross-entropy over the quantized
// model's parameters(), and export the trained QDQ model.
//
//   qat_example MODEL.onnx CONFIG.toml OUT.onnx [--epochs 1] [--train-count 60000] [--lr 1e-4]
//
// Fashion-MNIST from /usr/share/datasets/fashion-mnist (IDX). Prints test accuracy in float,
// quantized before training and quantized after each epoch.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <string>

#include "sparsebit/core/session.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;

namespace {

const std::string kData = "/usr/share/datasets/fashion-mnist";

double accuracy(sb::QuantModel& qm, const at::Tensor& images, const at::Tensor& labels) {
  const bool was_training = qm.training();
  qm.eval();  // BatchNormalization (if kept) on its running statistics
  c10::InferenceMode guard;
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < images.size(0); i += 500) {
    const std::int64_t n = std::min<std::int64_t>(500, images.size(0) - i);
    correct += (qm.forward({images.narrow(0, i, n)})[0].argmax(1) == labels.narrow(0, i, n)).sum().item<std::int64_t>();
  }
  qm.train(was_training);
  return 100.0 * double(correct) / double(images.size(0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.onnx CONFIG.toml OUT.onnx [--epochs N] [--train-count N] [--lr X]\n",
                 argv[0]);
    return 2;
  }
  int epochs = 1;
  std::int64_t train_count = 60000;
  double lr = 1e-4;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--epochs") epochs = std::stoi(argv[i + 1]);
    else if (k == "--train-count") train_count = std::stoll(argv[i + 1]);
    else if (k == "--lr") lr = std::stod(argv[i + 1]);
  }
  try {
    sb::sdk::set_log_level(sb::sdk::LogLevel::kWarn);
    sb::Config config = sb::Config::from_file(argv[2]);
    const sb::Session session(config);
    const sb::DataSource calib(kData + "/train-images-idx3-ubyte.gz");
    // The model as `sparsebit qat` prepares it (Note [Session]: pruning, BN re-estimation, passes).
    sb::QuantModel qm = session.quant_model(session.prepare(session.load(argv[1], calib), calib), calib);

    const at::Tensor train_x =
        sb::read_idx(kData + "/train-images-idx3-ubyte.gz", train_count).to(at::kFloat).div(255).unsqueeze(1);
    const at::Tensor train_y = sb::read_idx(kData + "/train-labels-idx1-ubyte.gz", train_count).to(at::kLong);
    const at::Tensor test_x = sb::read_idx(kData + "/t10k-images-idx3-ubyte.gz").to(at::kFloat).div(255).unsqueeze(1);
    const at::Tensor test_y = sb::read_idx(kData + "/t10k-labels-idx1-ubyte.gz").to(at::kLong);

    qm.set_quant(false, false);
    std::printf("float:              %.2f%%\n", accuracy(qm, test_x, test_y));
    qm.init_qat(*calib.open(qm.graph().inputs));  // calibrate, quantization on, weights trainable
    std::printf("quantized, PTQ:     %.2f%%\n", accuracy(qm, test_x, test_y));

    torch::optim::Adam adam(qm.parameters(), torch::optim::AdamOptions(lr));
    const std::int64_t batch = 64;
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      at::manual_seed(epoch);
      const at::Tensor order = at::randperm(train_x.size(0));
      double loss_sum = 0;
      std::int64_t steps = 0;
      for (std::int64_t i = 0; i < train_x.size(0); i += batch) {
        const at::Tensor idx = order.narrow(0, i, std::min(batch, train_x.size(0) - i));
        const at::Tensor logits = qm.forward({train_x.index_select(0, idx)})[0];
        at::Tensor loss = at::cross_entropy_loss(logits, train_y.index_select(0, idx));
        adam.zero_grad();
        loss.backward();
        adam.step();
        loss_sum += loss.item<double>();
        ++steps;
      }
      std::printf("quantized, epoch %d: %.2f%% (training loss %.4f)\n", epoch, accuracy(qm, test_x, test_y),
                  loss_sum / double(steps));
    }
    qm.export_onnx(argv[3]);
    std::printf("wrote %s\n", argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
