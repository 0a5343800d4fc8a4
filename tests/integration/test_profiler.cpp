// The error profiler on the Fashion-MNIST CNN with one layer made deliberately sensitive: its
// weights get 2 bits (one [[specific]] entry) while every other layer keeps 8. The
// one-layer-at-a-time view must rank it first.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/profiler.h"
#include "test_support.h"

namespace sparsebit {
namespace {

const char* kConfig = R"(
backend = "virtual"
[w]
qscheme = "per-tensor-symmetric"
[a]
qscheme = "per-tensor-affine"
[calibration]
batch_size = 32
count = 128
)";

const char* kSabotage = R"(
[[specific]]
nodes = "/dw3/Conv"
w = { bits = 2 }
)";

TEST(Profiler, TheSabotagedLayerRanksFirstAndReportsAreComplete) {
  QuantModel qm(load_onnx(testing::fixture_model()),
                Config::from_string(std::string(kConfig) + kSabotage, "profile.toml"), testing::shipped_registry());
  const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
  auto calib = open_dataset(images, qm.graph().inputs);
  qm.calibrate(*calib);
  auto data = open_dataset(images, qm.graph().inputs);
  int progress_calls = 0;
  ProfileOptions opt;
  opt.samples = 64;
  opt.progress = [&](std::int64_t, std::int64_t) { ++progress_calls; };
  ProfileReport r = profile(qm, *data, opt);

  ASSERT_FALSE(r.single.empty());
  EXPECT_EQ(r.samples, 64);
  EXPECT_EQ(progress_calls, static_cast<int>(r.single.size()));
  auto ranked = r.single;
  std::sort(ranked.begin(), ranked.end(), [](const LayerError& a, const LayerError& b) { return a.mse > b.mse; });
  EXPECT_EQ(ranked[0].node, "/dw3/Conv") << "second: " << ranked[1].node;
  EXPECT_GT(ranked[0].mse, 10 * ranked[1].mse);
  for (const auto& e : r.single) {
    EXPECT_GT(e.mse, 0) << e.node;
    EXPECT_LE(e.cosine, 1 + 1e-9) << e.node;
  }
  // Accumulated view: one entry per quantized layer, and the sabotaged layer's own output is
  // already badly off (SQNR far below the first conv's).
  ASSERT_EQ(r.accumulated.size(), r.single.size());
  double victim_sqnr = 0, first_sqnr = r.accumulated.front().sqnr_db;
  for (const auto& e : r.accumulated)
    if (e.node == "/dw3/Conv") victim_sqnr = e.sqnr_db;
  EXPECT_LT(victim_sqnr + 10, first_sqnr);
  // Quantizer switches are restored.
  for (const auto& s : qm.slots()) EXPECT_TRUE(s.enabled) << s.where();

  auto j = nlohmann::json::parse(profile_json(r));
  EXPECT_EQ(j["single"].size(), r.single.size());
  EXPECT_EQ(j["accumulated"][0]["node"], r.accumulated[0].node);
  const std::string html = profile_html(r);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("/dw3/Conv"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos) << "self-contained: no network";
}

TEST(Profiler, CliWritesJsonAndHtml) {
  testing::TempDir work;
  testing::write_text(work / "c.toml", kConfig);
  auto r = testing::run_cli("profile " + testing::fixture_model() + " -c " + (work / "c.toml") + " --calib " +
                            std::string(FASHION_MNIST_DIR) +
                            "/t10k-images-idx3-ubyte.gz --samples 32 --mode single -o " + (work / "report"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("most sensitive layers (one at a time)"), std::string::npos) << r.output;
  auto j = nlohmann::json::parse(testing::read_text(work / "report.json"));
  EXPECT_EQ(j["samples"], 32);
  EXPECT_TRUE(j["accumulated"].empty());
  EXPECT_FALSE(j["single"].empty());
  EXPECT_NE(testing::read_text(work / "report.html").find("<svg"), std::string::npos);
  r = testing::run_cli("profile " + testing::fixture_model() + " -c " + (work / "c.toml") + " --calib " +
                       (work / "none") + " -o " + (work / "bad"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(work / "bad.json")) << "a failed run leaves no report";
}

}  // namespace
}  // namespace sparsebit
