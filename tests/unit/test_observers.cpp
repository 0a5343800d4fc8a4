// Every shipped observer against independent references: hand-computed cases, and values
// computed by numpy on the full data (tests/observers/make_reference.py -> reference.json).
// Weights are observed once and take the exact path; activations stream (Note [Streaming
// histogram]) and must land within the histogram's resolution of the exact answer.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

QSpec symmetric8(bool weight) {
  QSpec s;
  s.is_weight = weight;
  return s;
}

std::unique_ptr<Observer> make(const std::string& name, const QSpec& spec, const Options& options = Options("[test]")) {
  const auto* e = testing::shipped_registry().observer(name);
  if (!e) throw Error("observer " + name + " not loaded");
  return e->factory(ObserverContext{spec, options, "test tensor"});
}

struct Reference {
  at::Tensor data;
  nlohmann::json values;
  Reference() {
    data = read_npy(testing::source_path("tests/observers/data.npy"));
    std::ifstream in(testing::source_path("tests/observers/reference.json"));
    values = nlohmann::json::parse(in);
  }
  QParams expected(const std::string& key, const QSpec& spec) const {
    return qparams_from_range(at::scalar_tensor(values[key][0].get<double>()), at::scalar_tensor(values[key][1].get<double>()),
                              spec, key);
  }
};

const Reference& reference() {
  static Reference r;
  return r;
}

void expect_scale_near(const QParams& got, const QParams& want, double rtol, const std::string& what) {
  const double g = got.scale.item<double>(), w = want.scale.item<double>();
  EXPECT_NEAR(g, w, rtol * w) << what << ": scale " << g << " vs reference " << w;
}

QParams observe_exact(const std::string& name, const Options& options = Options("[test]")) {
  auto obs = make(name, symmetric8(true), options);
  obs->observe(reference().data);
  return obs->compute();
}

QParams observe_streaming(const std::string& name, const Options& options = Options("[test]")) {
  auto obs = make(name, symmetric8(false), options);
  for (const auto& chunk : reference().data.chunk(8)) obs->observe(chunk.reshape({-1, 8}));
  return obs->compute();
}

TEST(Observers, MinMaxByHandPerTensorAndPerChannel) {
  QSpec aff;
  aff.symmetric = false;
  auto obs = make("minmax", aff);
  obs->observe(at::tensor({-1.0f, 0.5f}));
  obs->observe(at::tensor({2.0f, -0.25f}));
  QParams p = obs->compute();
  EXPECT_FLOAT_EQ(p.scale.item<float>(), 3.0f / 255);
  EXPECT_EQ(p.zero_point.item<int>(), 85);  // round(1 / (3/255))
  QSpec pc = symmetric8(true);
  pc.per_channel = true;
  pc.channel_axis = 1;
  auto w = make("minmax", pc);
  w->observe(at::tensor({1.0f, -4.0f, -2.0f, 0.5f}).reshape({2, 2}));
  p = w->compute();
  EXPECT_FLOAT_EQ(p.scale[0].item<float>(), 2 * 2.0f / 255);
  EXPECT_FLOAT_EQ(p.scale[1].item<float>(), 2 * 4.0f / 255);
}

TEST(Observers, PercentileMatchesExactOrderStatistics) {
  for (double alpha : {1e-3, 1e-2}) {
    Options o("[test]");
    o.set("alpha", alpha);
    const std::string key = alpha == 1e-3 ? "percentile_1e-3" : "percentile_1e-2";
    expect_scale_near(observe_exact("percentile", o), reference().expected(key, symmetric8(true)), 1e-6, key + " exact");
    expect_scale_near(observe_streaming("percentile", o), reference().expected(key, symmetric8(false)), 5e-3,
                      key + " streaming");
  }
  // By hand: -1.000 .. 1.000 in steps of 0.001 (1000 negative, 1001 non-negative), alpha 1e-2:
  // the 10th smallest is -0.991, the 11th largest is 0.990.
  Options o("[test]");
  o.set("alpha", 1e-2);
  auto obs = make("percentile", symmetric8(true), o);
  obs->observe(at::arange(-1000, 1001, at::kDouble).div(1000).to(at::kFloat));
  EXPECT_FLOAT_EQ(obs->compute().scale.item<float>(), static_cast<float>(2 * 0.991 / 255));
}

TEST(Observers, MseMatchesTheGridSearchReference) {
  expect_scale_near(observe_exact("mse"), reference().expected("mse", symmetric8(true)), 1e-6, "mse exact");
  expect_scale_near(observe_streaming("mse"), reference().expected("mse", symmetric8(false)), 2e-2, "mse streaming");
}

TEST(Observers, KlMatchesTheTensorRTAlgorithmOnAFixedHistogram) {
  // One observe call: the histogram spans exactly [-max|x|, max|x|] in 4096 bins, the same bins
  // the reference builds, so the threshold must agree exactly.
  expect_scale_near(observe_exact("kl_histogram"), reference().expected("kl_histogram", symmetric8(true)), 1e-6, "kl");
  // Streaming: the range doubled while batches arrived, so bins are coarser; still close.
  expect_scale_near(observe_streaming("kl_histogram"), reference().expected("kl_histogram", symmetric8(false)), 5e-2,
                    "kl streaming");
  // KL clips the outliers that minmax keeps.
  EXPECT_LT(observe_exact("kl_histogram").scale.item<double>(), observe_exact("minmax").scale.item<double>() * 0.6);
}

TEST(Observers, AciqMatchesItsFormulas) {
  Options laplace("[test]");
  laplace.set("distribution", std::string("laplace"));
  expect_scale_near(observe_exact("aciq", laplace), reference().expected("aciq_laplace", symmetric8(true)), 1e-5, "laplace");
  expect_scale_near(observe_streaming("aciq", laplace), reference().expected("aciq_laplace", symmetric8(false)), 1e-2,
                    "laplace streaming");
  Options gaus("[test]");
  gaus.set("distribution", std::string("gaus"));
  expect_scale_near(observe_exact("aciq", gaus), reference().expected("aciq_gaus", symmetric8(true)), 1e-5, "gaus");
  QSpec four = symmetric8(true);
  four.bits = 4;
  auto obs = make("aciq", four, laplace);
  obs->observe(reference().data);
  QParams want = qparams_from_range(at::scalar_tensor(reference().values["aciq_laplace_4bit"][0].get<double>()),
                                    at::scalar_tensor(reference().values["aciq_laplace_4bit"][1].get<double>()), four, "4bit");
  expect_scale_near(obs->compute(), want, 1e-5, "laplace 4-bit");
  // By hand, Gaussian: values -1, -0.5, 0, 0.5, 1 (N = 5):
  // sigma = 2 * 0.175 * (1 + sqrt(pi ln 4)) / sqrt(2 ln 5); clip = 3.92 sigma = 2.3605...
  auto g = make("aciq", symmetric8(true), gaus);
  g->observe(at::tensor({-1.0f, -0.5f, 0.0f, 0.5f, 1.0f}));
  EXPECT_NEAR(g->compute().scale.item<double>(), 2 * 2.3605261 / 255, 1e-6);
  Options bad("[test]");
  bad.set("distribution", std::string("cauchy"));
  EXPECT_THROW(make("aciq", symmetric8(true), bad), Error);
}

TEST(Observers, MovingAverageByHand) {
  QSpec aff;
  aff.symmetric = false;
  auto obs = make("moving_average", aff);
  obs->observe(at::tensor({-1.0f, 2.0f}));
  obs->observe(at::tensor({-3.0f, 1.0f}));
  // min = 0.9 * -1 + 0.1 * -3 = -1.2; max = 0.9 * 2 + 0.1 * 1 = 1.9
  QParams p = obs->compute();
  EXPECT_NEAR(p.scale.item<double>(), 3.1 / 255, 1e-7);
  EXPECT_EQ(p.zero_point.item<int>(), 99);  // round(1.2 / (3.1/255)) = round(98.71)
  Options o("[test]");
  o.set("ema_ratio", 1.5);
  EXPECT_THROW(make("moving_average", aff, o), Error);
}

TEST(Observers, PerChannelObserversScaleWithTheirChannel) {
  QSpec pc = symmetric8(true);
  pc.per_channel = true;
  at::Tensor w = at::stack({reference().data, reference().data * 2}, 0);
  for (const char* name : {"minmax", "percentile", "mse", "kl_histogram", "aciq"}) {
    auto obs = make(name, pc);
    obs->observe(w);
    QParams p = obs->compute();
    ASSERT_EQ(p.scale.numel(), 2) << name;
    EXPECT_NEAR(p.scale[1].item<double>() / p.scale[0].item<double>(), 2.0, 1e-2) << name;
  }
}

TEST(Observers, NothingObservedIsAnError) {
  for (const char* name : {"minmax", "percentile", "mse", "moving_average", "kl_histogram", "aciq"}) {
    auto obs = make(name, symmetric8(false));
    EXPECT_THROW(obs->compute(), Error) << name;
  }
}

// Peak RSS of a `sparsebit quantize` child process, in KiB.
long child_peak_rss_kib(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return usage.ru_maxrss;
}

TEST(Observers, HistogramObserversStreamMemoryIndependentOfSampleCount) {
  testing::TempDir dir;
  std::string cfg = dir / "kl.toml";
  testing::write_text(cfg, "backend = \"tensorrt\"\n[a]\nobserver = \"kl_histogram\"\n[calibration]\nbatch_size = 32\n");
  auto run = [&](int count) {
    return child_peak_rss_kib({SPARSEBIT_CLI, "-q", "quantize", testing::fixture_model(), "-c", cfg, "--calib",
                               std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", "--calib-count",
                               std::to_string(count), "-o", dir / ("q" + std::to_string(count) + ".onnx")});
  };
  const long small = run(256), large = run(1024);
  std::printf("peak RSS: %ld KiB at 256 samples, %ld KiB at 1024 samples\n", small, large);
  EXPECT_LT(std::abs(large - small), small / 10);
}

}  // namespace
}  // namespace sparsebit
