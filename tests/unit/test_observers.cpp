// The observer contract across every shipped observer (per-channel scaling, nothing observed,
// streaming memory). Each observer's own values are tested in its plugin folder
// (plugins/observers/<name>/tests/) against hand values and numpy references.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "observer_testing.h"

namespace sparsebit::testing {
namespace {

TEST(Observers, PerChannelObserversScaleWithTheirChannel) {
  QSpec pc = symmetric8(true);
  pc.per_channel = true;
  at::Tensor w = at::stack({reference().data, reference().data * 2}, 0);
  for (const char* name : {"minmax", "percentile", "mse", "kl_histogram", "aciq"}) {
    auto obs = make_observer(name, pc);
    obs->observe(w);
    QParams p = obs->compute();
    ASSERT_EQ(p.scale.numel(), 2) << name;
    EXPECT_NEAR(p.scale[1].item<double>() / p.scale[0].item<double>(), 2.0, 1e-2) << name;
  }
}

TEST(Observers, NothingObservedIsAnError) {
  for (const char* name : {"minmax", "percentile", "mse", "moving_average", "kl_histogram", "aciq"}) {
    auto obs = make_observer(name, symmetric8(false));
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
  TempDir dir;
  std::string cfg = dir / "kl.toml";
  write_text(cfg, "backend = \"tensorrt\"\n[a]\nobserver = \"kl_histogram\"\n[calibration]\nbatch_size = 32\n");
  auto run = [&](int count) {
    return child_peak_rss_kib({SPARSEBIT_CLI, "-q", "quantize", fixture_model(), "-c", cfg, "--calib",
                               std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", "--calib-count",
                               std::to_string(count), "-o", dir / ("q" + std::to_string(count) + ".onnx")});
  };
  const long small = run(256), large = run(1024);
  std::printf("peak RSS: %ld KiB at 256 samples, %ld KiB at 1024 samples\n", small, large);
  EXPECT_LT(std::abs(large - small), small / 10);
}

}  // namespace
}  // namespace sparsebit::testing
