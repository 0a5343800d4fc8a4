// Pruning on a Fashion-MNIST classifier: top-1 before and after fine-tuning at several
// sparsities, with the size and MACs of each pruned model, as a Markdown table
// (docs/ACCURACY.md, bench/RESULTS.md).
//
//   prune_bench MODEL.onnx [--ratios 0.25,0.5,0.75] [--epochs 1] [--lr 1e-3] [--train-count 60000]
//               [--eval-count 10000] [--threads N] [--patterns channel,element,2:4] [--skip GLOB,...]
//               [--bias-compensation on|off] (--epochs 0: no fine-tuning)
//
// Rows: every pattern (channel: l1_structured, channels removed; element: l1_unstructured;
// 2:4: n_m, whose ratio is fixed at 0.5) at every ratio. Fine-tuning: sparsebit::finetune,
// distillation (MSE to the unpruned model's logits) with Adam, batch 64, training images in
// order; zeros of element and 2:4 sparsity are kept. The baseline row is the unpruned model.
// The column "+ bias comp." prunes again with bias compensation (sparsebit/core/prune.h, means
// over 1,024 training images) and is not fine-tuned; --bias-compensation on fine-tunes that one.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include "bench_support.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;
using sb::bench::kFashionMnist;

namespace {

double top1(const sb::Model& m, const sb::Registry& registry, const at::Tensor& images, const at::Tensor& labels) {
  sb::Executor ex(m.graph, registry);
  c10::InferenceMode guard;
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < images.size(0); i += 500) {
    const std::int64_t n = std::min<std::int64_t>(500, images.size(0) - i);
    correct += (ex.run({{m.graph.inputs[0].name, images.narrow(0, i, n)}})[0].argmax(1) == labels.narrow(0, i, n))
                   .sum()
                   .item<std::int64_t>();
  }
  return 100.0 * double(correct) / double(images.size(0));
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: %s MODEL.onnx [--ratios 0.25,0.5,0.75] [--epochs N] [--lr X] [--train-count N] [--eval-count N] "
        "[--threads T] [--patterns channel,element,2:4] [--skip GLOB,...]\n",
        argv[0]);
    return 2;
  }
  const std::string model_path = argv[1];
  std::vector<std::string> ratios = {"0.25", "0.5", "0.75"}, patterns = {"channel"}, skip;
  int epochs = 1, threads = 1;
  bool compensate = false;
  double lr = 1e-3;
  std::int64_t train_count = 60000, eval_count = 10000;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--ratios") ratios = split(v);
    else if (k == "--patterns") patterns = split(v);
    else if (k == "--skip") skip = split(v);
    else if (k == "--bias-compensation") compensate = v == "on";
    else if (k == "--epochs") epochs = std::stoi(v);
    else if (k == "--lr") lr = std::stod(v);
    else if (k == "--train-count") train_count = std::stoll(v);
    else if (k == "--eval-count") eval_count = std::stoll(v);
    else if (k == "--threads") threads = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  at::set_num_threads(threads);
  sb::sdk::set_log_level(sb::sdk::LogLevel::kWarn);
  sb::Registry registry;
  sb::PluginSearch search;
  search.use_environment = false;
  registry.load(search);

  const sb::Model model = sb::load_onnx(model_path);
  const std::string train = kFashionMnist + "/train-images-idx3-ubyte.gz";
  const at::Tensor images =
      sb::read_idx(kFashionMnist + "/t10k-images-idx3-ubyte.gz", eval_count).to(at::kFloat).div(255).unsqueeze(1);
  const at::Tensor labels = sb::read_idx(kFashionMnist + "/t10k-labels-idx1-ubyte.gz", eval_count).to(at::kLong);
  const auto sample = sb::sample_inputs(model.graph, train);

  sb::QatConfig ft;
  ft.epochs = epochs;
  ft.lr = lr;
  ft.batch_size = 64;
  ft.count = static_cast<int>(train_count);

  std::printf(
      "%s: %lld test images, fine-tuning %d epoch(s) over %lld images (Adam lr %g, batch 64, MSE distillation), "
      "%d thread(s)\n\n",
      model_path.c_str(), static_cast<long long>(images.size(0)), epochs, static_cast<long long>(train_count), lr,
      threads);
  std::printf(
      "| pattern | ratio | parameters | non-zero | MACs | top-1 pruned | + bias comp. | top-1 fine-tuned | fine-tune s "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  const double base = top1(model, registry, images, labels);
  const sb::ModelStats base_stats = sb::model_stats(model, registry, sample);
  std::printf("| none (FP32) | 0 | %lld | %lld | %lld | %.2f | | | |\n", static_cast<long long>(base_stats.parameters),
              static_cast<long long>(base_stats.nonzero_parameters), static_cast<long long>(base_stats.macs), base);
  std::fflush(stdout);
  for (const auto& pattern : patterns) {
    for (const auto& ratio : pattern == "2:4" ? std::vector<std::string>{"0.5"} : ratios) {
      const std::string sparser = pattern == "channel"   ? "l1_structured"
                                  : pattern == "element" ? "l1_unstructured"
                                                         : "n_m";
      std::string toml = "[sparse]\nsparser = \"" + sparser + "\"\n";
      if (pattern != "2:4") toml += "ratio = " + ratio + "\n";
      std::string globs;
      for (const auto& g : skip) globs += (globs.empty() ? "\"" : ", \"") + g + "\"";
      toml += "skip = [" + globs + "]\n";
      sb::Config c = sb::Config::from_string(toml, "bench");
      c.calibration.count = 1024;  // means for bias compensation
      auto data = sb::open_dataset(train, model.graph.inputs);
      c.sparse->bias_compensation = true;
      sb::PruneResult compensated = sb::prune(model, c, registry, sample, data.get());
      const double pruned_compensated = top1(compensated.pruned, registry, images, labels);
      sb::PruneResult r = compensate ? std::move(compensated) : sb::prune(model, c, registry, sample);
      const double pruned = top1(r.pruned, registry, images, labels);
      sb::Model student{r.pruned.graph.clone(), r.pruned.meta};
      const auto t0 = std::chrono::steady_clock::now();
      if (epochs > 0)
        sb::finetune(
            student, model, registry, [&] { return sb::open_dataset(train, student.graph.inputs); }, ft);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tuned = top1(student, registry, images, labels);
      std::printf("| %s | %s | %lld (%.2f) | %lld (%.2f) | %lld (%.2f) | %.2f | %.2f | %.2f | %.0f |\n",
                  pattern.c_str(), ratio.c_str(), static_cast<long long>(r.after.parameters),
                  double(r.after.parameters) / double(base_stats.parameters),
                  static_cast<long long>(r.after.nonzero_parameters),
                  double(r.after.nonzero_parameters) / double(base_stats.parameters),
                  static_cast<long long>(r.after.macs), double(r.after.macs) / double(base_stats.macs), pruned,
                  pruned_compensated, tuned, seconds);
      std::fflush(stdout);
    }
  }
  return 0;
}
