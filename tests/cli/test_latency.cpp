// The latency step (Note [Latency step]): `quantize` times its export against the float model in
// ONNX Runtime and reports both, says so where it cannot, and fails only where asked to time.
// What is asserted is that the numbers exist and come from the runtime, not how fast anything
// is: speed lives in bench/deploy_latency.sh.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;

class Latency : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(work_ / "calib");
    at::manual_seed(5);
    write_npy(at::rand({8, 1, 28, 28}), work_ / "calib/batch0.npy");
  }
  testing::CommandResult quantize(const std::string& latency_table, const std::string& flags) {
    testing::write_text(work_ / "c.toml", testing::read_text(testing::source_path("configs/w8a8_onnxruntime.toml")) +
                                              "\n" + latency_table + "\n");
    return run_cli("quantize " + testing::fixture_model() + " -c " + work_ / "c.toml" + " --calib " + work_ / "calib" +
                   " -o " + work_ / "q.onnx --report " + work_ / "r.json " + flags);
  }
  testing::TempDir work_;
};

TEST_F(Latency, QuantizeTimesTheExportAgainstTheFloatModelAtEachThreadCount) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  const auto r = quantize("[latency]\nthreads = [1, 2]\nruns = 3", "--latency");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("latency in ONNX Runtime, 1 thread: float"), std::string::npos) << r.output;
  const auto report = nlohmann::json::parse(testing::read_text(work_ / "r.json"));
  const auto& l = report.at("latency");
  EXPECT_TRUE(l.at("measured").get<bool>());
  ASSERT_EQ(l.at("rows").size(), 2u);
  EXPECT_EQ(l.at("rows")[1].at("threads").get<int>(), 2);
  for (const auto& row : l.at("rows")) {
    EXPECT_GT(row.at("float_ms").get<double>(), 0);
    EXPECT_GT(row.at("export_ms").get<double>(), 0);
    EXPECT_NEAR(row.at("speedup").get<double>(), row.at("float_ms").get<double>() / row.at("export_ms").get<double>(),
                1e-9);
  }
  EXPECT_EQ(l.at("float_bytes").get<std::int64_t>(),
            static_cast<std::int64_t>(fs::file_size(testing::fixture_model())));
  EXPECT_EQ(l.at("export_bytes").get<std::int64_t>(), static_cast<std::int64_t>(fs::file_size(work_ / "q.onnx")));
}

TEST_F(Latency, AMissingRuntimeIsSaidAndFailsOnlyWhereTimingWasAskedFor) {
  const std::string missing = "[latency]\nruntime = \"" + work_ / "no_such_runtime" + "\"";
  const auto quiet = quantize(missing, "");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_NE(quiet.output.find("latency: not measured"), std::string::npos) << quiet.output;
  EXPECT_NE(quiet.output.find("no_such_runtime"), std::string::npos) << quiet.output;
  fs::remove(work_ / "q.onnx");
  fs::remove(work_ / "r.json");
  const auto strict = quantize(missing, "--latency");
  EXPECT_NE(strict.exit_code, 0);
  EXPECT_NE(strict.output.find("[latency] enabled = true, but ONNX Runtime"), std::string::npos) << strict.output;
  EXPECT_NE(strict.output.find("set [latency] runtime"), std::string::npos) << strict.output;
  EXPECT_FALSE(fs::exists(work_ / "q.onnx")) << "a failed run leaves no file";
  const auto off = quantize("", "--no-latency");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(off.output.find("latency"), std::string::npos) << off.output;
}

TEST(LatencyConfig, BadValuesNameTheKey) {
  EXPECT_NE(testing::error_of([] { Config::from_string("[latency]\nthreads = []", "t.toml"); }).find("latency.threads"),
            std::string::npos);
  EXPECT_NE(
      testing::error_of([] { Config::from_string("[latency]\nthreads = [-1]", "t.toml"); }).find("latency.threads"),
      std::string::npos);
  EXPECT_NE(testing::error_of([] { Config::from_string("[latency]\nruns = 0", "t.toml"); }).find("latency.runs"),
            std::string::npos);
  EXPECT_NE(
      testing::error_of([] { Config::from_string("[latency]\nenabled = \"yes\"", "t.toml"); }).find("latency.enabled"),
      std::string::npos);
  EXPECT_NE(testing::error_of([] { Config::from_string("[latency]\nthread = [1]", "t.toml"); }).find("thread"),
            std::string::npos);
  const Config c = Config::from_string("[latency]\nenabled = false\nthreads = [4]\nruns = 7", "t.toml");
  EXPECT_EQ(c.latency.enabled, "off");
  EXPECT_EQ(c.latency.threads, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(c.latency.runs, 7);
}

}  // namespace
}  // namespace sparsebit
