// QAT on a GPU with [qat] cuda_graph = true against eager steps (Note [CUDA graph steps]): with
// deterministic algorithms on, the same loss at every step and the same trained tensors, from
// replayed graphs (counted); with the teacher's outputs cached too; and a step that cannot be
// recorded (a callback after it reads a value from the GPU) trains eagerly to the same losses
// after a warning. AdaRound's reconstruction with [calibration] cuda_graph = true against eager
// steps (Note [Recorded reconstruction steps]): the same learnt rounding, steps replayed
// (counted), a short batch's steps eager. Needs a CUDA build and a GPU (docs/GPU.md).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/core/quant_model.h"
#include "test_support.h"

namespace sparsebit {
namespace {

// Random images in batches of 32, the same on every opening.
class Images final : public Dataset {
 public:
  explicit Images(std::int64_t batches) : batches_(batches) {}
  std::string describe() const override { return "random images"; }
  std::optional<std::int64_t> num_samples() const override { return batches_ * 32; }
  std::optional<Batch> next() override {
    if (next_ == batches_) return std::nullopt;
    at::Generator gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(1000 + next_++));
    Batch b{{at::rand({32, 1, 28, 28}, gen)}, "random batch"};
    b.batched = true;
    return b;
  }

 private:
  std::int64_t batches_, next_ = 0;
};

struct TrainingRun {
  std::vector<double> losses;  // each step's own loss
  std::vector<std::int64_t> graphed;
  std::vector<at::Tensor> parameters;
};

TrainingRun train(bool graphs, bool cache_teacher, std::function<void()> after_step = {}) {
  Config c = Config::from_string(R"(
backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
bits = 4
quantizer = "lsq"
[a]
qscheme = "per-tensor-affine"
bits = 4
quantizer = "lsq"
[calibration]
batch_size = 32
count = 64
device = "cuda"
[qat]
epochs = 3
batch_size = 32
count = 320
lr = 1e-3
deterministic = true
)",
                                 "graphs test");
  c.qat.cuda_graph = graphs;
  c.qat.cache_teacher = cache_teacher;
  c.plugins.use_environment = false;
  Model float_model = load_onnx(testing::fixture_model());
  Executor teacher(float_model.graph, testing::shipped_registry());
  teacher.to("cuda");
  QuantModel student(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  Images calib(2);
  student.init_qat(calib);
  TrainingRun r;
  double previous_mean = 0;
  std::int64_t steps = 0;
  auto progress = [&](int, std::int64_t done, std::int64_t, double mean) {
    // The running mean of the epoch's steps back to each step's own loss.
    const std::int64_t k = done / 32;
    r.losses.push_back(mean * double(k) - previous_mean * double(k - 1));
    previous_mean = k == 10 ? 0 : mean;
    ++steps;
  };
  const QatResult result = distill(
      student, teacher, [] { return std::make_unique<Images>(10); }, {c.qat, "", "", std::move(after_step)}, progress);
  for (const auto& e : result.epochs) r.graphed.push_back(e.graphed_steps);
  for (const auto& [name, t] : student.named_parameters()) r.parameters.push_back(t.detach().cpu());
  EXPECT_EQ(steps, 30);
  return r;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

void expect_same(const TrainingRun& a, const TrainingRun& b, double tolerance) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.losses.size(); ++i) worst = std::max(worst, relative(a.losses[i], b.losses[i]));
  if (worst > tolerance)
    for (std::size_t i = 0; i < a.losses.size(); ++i)
      std::cout << "step " << i + 1 << ": " << a.losses[i] << " vs " << b.losses[i] << "\n";
  EXPECT_LE(worst, tolerance) << "largest relative loss difference over " << a.losses.size() << " steps";
  std::cout << "largest relative loss difference: " << worst << "\n";
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  double params = 0;
  for (std::size_t i = 0; i < a.parameters.size(); ++i)
    params = std::max(params, (a.parameters[i] - b.parameters[i]).abs().max().item<double>() /
                                  std::max(b.parameters[i].abs().max().item<double>(), 1e-12));
  EXPECT_LE(params, 10 * tolerance) << "largest relative parameter difference";
  std::cout << "largest relative parameter difference: " << params << "\n";
}

// FusedAdam counting its steps on the GPU (what the graphs record) against torch::optim::Adam.
TEST(TrainingGraphs, AdamCountingOnTheGpuStaysAdam) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  at::manual_seed(3);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  std::vector<at::Tensor> start{at::randn({64, 3, 3, 3}, cuda), at::randn({64}, cuda), at::randn({}, cuda)};
  auto make = [&] {
    std::vector<at::Tensor> p;
    for (const auto& t : start) p.push_back(t.clone().set_requires_grad(true));
    return p;
  };
  auto a = make(), b = make();
  const auto options = torch::optim::AdamOptions(1e-3);
  torch::optim::Adam plain(a, options);
  FusedAdam fused(b, options);
  for (int step = 0; step < 10; ++step) {
    if (step == 3) ASSERT_TRUE(fused.count_steps_on_device());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const at::Tensor g = at::randn(a[i].sizes(), cuda);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    plain.step();
    fused.step();
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-6) << "step " << step << ", tensor " << i;
  }
}

TEST(TrainingGraphs, RecordedStepsGiveTheEagerLosses) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  const TrainingRun eager = train(false, false);
  EXPECT_EQ(eager.graphed, (std::vector<std::int64_t>{0, 0, 0}));
  // Training moves the loss: a comparison of constants would prove nothing.
  EXPECT_GT(relative(eager.losses.front(), eager.losses.back()), 0.05);
  const TrainingRun graphed = train(true, false);
  EXPECT_EQ(graphed.graphed, (std::vector<std::int64_t>{7, 10, 10}));  // after 3 eager steps
  expect_same(graphed, eager, 1e-5);
  const TrainingRun cached = train(true, true);
  EXPECT_EQ(cached.graphed, (std::vector<std::int64_t>{7, 10, 10}));
  expect_same(cached, eager, 1e-5);
}

TEST(TrainingGraphs, AStepThatCannotBeRecordedTrainsEagerly) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  // Reads the first trained tensor's sum after every step, as a logging callback might.
  double seen = 0;
  auto reads = [&seen] { seen += at::ones({1}, at::TensorOptions().device(at::kCUDA)).sum().item<double>(); };
  const TrainingRun eager = train(false, false, reads);
  const TrainingRun fallback = train(true, false, reads);
  EXPECT_EQ(seen, 60.0);  // called after all 30 steps of both runs
  EXPECT_EQ(fallback.graphed, (std::vector<std::int64_t>{0, 0, 0}));
  expect_same(fallback, eager, 1e-5);
}

// Deterministic algorithms (cuDNN's too) while alive.
class Deterministic {
 public:
  Deterministic()
      : algorithms_(at::globalContext().deterministicAlgorithms()),
        cudnn_(at::globalContext().deterministicCuDNN()),
        benchmark_(at::globalContext().benchmarkCuDNN()) {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  ~Deterministic() {
    at::globalContext().setDeterministicAlgorithms(algorithms_, false);
    at::globalContext().setDeterministicCuDNN(cudnn_);
    at::globalContext().setBenchmarkCuDNN(benchmark_);
  }

 private:
  bool algorithms_, cudnn_, benchmark_;
};

// AdaRound over the fixture CNN on the GPU: each layer's report, and every initializer of the
// exported model (the weights' integers among them).
struct Reconstruction {
  std::vector<ReconstructionReport> layers;
  std::vector<at::Tensor> weights;
};

Reconstruction reconstruct(bool graphs, std::int64_t samples) {
  Config c = Config::from_string(R"(
backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
bits = 4
quantizer = "adaround"
[w.quantizer_options]
iterations = 300
batch_size = 20
learning_rate = 1e-2
[a]
qscheme = "per-tensor-affine"
bits = 8
[calibration]
batch_size = 32
device = "cuda"
mode = "asym"
)",
                                 "reconstruction graphs test");
  c.calibration.cuda_graph = graphs;
  c.calibration.count = static_cast<int>(samples);
  c.plugins.use_environment = false;
  QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  Images calib(4);
  Deterministic deterministic;
  Reconstruction r;
  r.layers = qm.calibrate(calib).reconstructions;
  for (const auto& [name, t] : qm.export_graph().initializers) r.weights.push_back(t.detach().cpu());
  return r;
}

void expect_same(const Reconstruction& a, const Reconstruction& b) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].mse_learnt, b.layers[i].mse_learnt) << a.layers[i].node;
    EXPECT_EQ(a.layers[i].mse_nearest, b.layers[i].mse_nearest) << a.layers[i].node;
    EXPECT_LT(a.layers[i].mse_learnt, a.layers[i].mse_nearest) << a.layers[i].node;  // it learnt something
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (std::size_t i = 0; i < a.weights.size(); ++i) EXPECT_TRUE(at::equal(a.weights[i], b.weights[i])) << i;
}

TEST(ReconstructionGraphs, RecordedStepsLearnTheEagerRounding) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  // 96 samples: three batches of 32, every step draws 20 rows of one.
  const Reconstruction eager = reconstruct(false, 96);
  ASSERT_GE(eager.layers.size(), 3u);
  for (const auto& l : eager.layers) EXPECT_EQ(l.recorded_steps, 0) << l.node;
  const Reconstruction graphed = reconstruct(true, 96);
  for (const auto& l : graphed.layers) EXPECT_EQ(l.recorded_steps, 297) << l.node;  // after 3 eager steps
  expect_same(graphed, eager);
}

TEST(ReconstructionGraphs, AShortBatchsStepsRunEagerly) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  // 80 samples: batches of 32, 32 and 16; a step on the last takes its 16 rows whole.
  const Reconstruction eager = reconstruct(false, 80);
  const Reconstruction graphed = reconstruct(true, 80);
  for (const auto& l : graphed.layers) {
    EXPECT_GT(l.recorded_steps, 150) << l.node;
    EXPECT_LT(l.recorded_steps, 297) << l.node;
  }
  expect_same(graphed, eager);
}

}  // namespace
}  // namespace sparsebit
