// The latency step (Note [Latency step]): `quantize` times its export against the float model in
// ONNX Runtime and reports both, says so where it cannot, and fails only where asked to time.
// What is asserted is that the numbers exist and come from the runtime, not how fast anything
// is: speed lives in bench/deploy_latency.sh.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
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

// Note [Latency search], with a runtime whose times are known: a stand-in for onnxruntime-node
// (the package's entry point, dist/index.js) whose sessions busy-wait a time computed from which
// regions the model quantizes (`q.a` is true while region a's Q is in the file), on any processor.
// The model: one Conv, Relu, Conv, Tanh region per name, in a chain.
class LatencySearch : public ::testing::Test {
 protected:
  testing::CommandResult quantize(const std::vector<std::string>& regions, const std::string& ms) {
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs = {{"x", 1, true, {{1, ""}, {8, ""}, {12, ""}, {12, ""}}, ""}};
    g.outputs = {{"y", 1, true, {{1, ""}, {8, ""}, {12, ""}, {12, ""}}, ""}};
    at::manual_seed(3);
    const auto pad = Attribute::of_ints({1, 1, 1, 1});
    std::string x = "x", quantized;
    for (const auto& r : regions) {
      g.initializers["w_" + r + "1"] = at::randn({8, 8, 3, 3}) * 0.2;
      g.initializers["w_" + r + "2"] = at::randn({8, 8, 3, 3}) * 0.2;
      g.append(testing::make_node(r + "1", "Conv", {x, "w_" + r + "1"}, {r + "_conv"}, {{"pads", pad}}));
      g.append(testing::make_node(r + "_relu_node", "Relu", {r + "_conv"}, {r + "_relu"}));
      g.append(testing::make_node(r + "2", "Conv", {r + "_relu", "w_" + r + "2"}, {r + "_out"}, {{"pads", pad}}));
      x = r == regions.back() ? "y" : r + "_tanh";
      g.append(testing::make_node(r + "_tanh", "Tanh", {r + "_out"}, {x}));
      quantized += r + ": text.includes('" + r + "_relu_QuantizeLinear'), ";
    }
    save_onnx(g, ModelMeta{}, work_ / "m.onnx");
    fs::create_directories(work_ / "calib");
    write_npy(at::rand({4, 8, 12, 12}), work_ / "calib/batch0.npy");
    fs::create_directories(work_ / "runtime/dist");
    testing::write_text(work_ / "runtime/dist/index.js", R"(
const fs = require('fs');
class Tensor { constructor(type, data, dims) { Object.assign(this, { type, data, dims }); } }
class InferenceSession {
  static async create(file) {
    const s = new InferenceSession();
    const text = fs.readFileSync(file).toString('latin1');
    const q = { )" + quantized + R"( };
    s.ms = )" + ms + R"(;
    return s;
  }
  async run() { const t0 = performance.now(); while (performance.now() - t0 < this.ms); return {}; }
  async release() {}
}
module.exports = { Tensor, InferenceSession };
)");
    testing::write_text(work_ / "c.toml", testing::read_text(testing::source_path("configs/w8a8_onnxruntime.toml")) +
                                              "\n[latency]\nthreads = [1]\nruns = 10\nruntime = \"" +
                                              work_ / "runtime" + "\"\n");
    return run_cli("quantize " + work_ / "m.onnx" + " -c " + work_ / "c.toml" + " --calib " + work_ / "calib" + " -o " +
                   work_ / "q.onnx --report " + work_ / "r.json --latency");
  }
  nlohmann::json report() const { return nlohmann::json::parse(testing::read_text(work_ / "r.json")); }
  /// Region (its nodes as JSON) -> whether the search left it float.
  std::map<std::string, bool> made_float() const {
    std::map<std::string, bool> out;
    const auto rep = report();
    for (const auto& region : rep.at("latency").at("search").at("timed"))
      out[region.at("nodes").dump()] = region.at("made_float").get<bool>();
    return out;
  }
  testing::TempDir work_;
};

// Region a as integers is faster (20 ms more without its Q), region b slower (20 ms more with):
// the search finds the two regions, leaves b float and keeps a quantized.
TEST_F(LatencySearch, ARegionThatRunsSlowerQuantizedIsLeftFloat) {
  const auto r = quantize({"a", "b"}, "2 + (q.a ? 0 : 20) + (q.b ? 20 : 0)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto search = report().at("latency").at("search");
  ASSERT_TRUE(search.at("ran").get<bool>()) << search.dump();
  EXPECT_EQ(search.at("regions").get<int>(), 2);
  EXPECT_EQ(made_float(),
            (std::map<std::string, bool>{{R"(["a1","a2","a_tanh"])", false}, {R"(["b1","b2","b_tanh"])", true}}))
      << search.dump();
  EXPECT_FALSE(search.at("reverted").get<bool>());
  // 22 ms against 2 per run, plus the harness's own time in both (a few ms under the sanitizers):
  // (22 + d) / (2 + d) stays above 3 for any d up to 8 ms.
  EXPECT_GT(search.at("speedup_together")[0].get<double>(), 3.0);
  EXPECT_LT(search.at("speedup_together")[0].get<double>(), 22.0 / 2.0 + 3.0);
  std::set<std::string> kept;
  const auto rep = report();
  for (const auto& k : rep.at("kept_float")) {
    EXPECT_EQ(k.at("why"), "latency");
    kept.insert(k.at("node").get<std::string>());
  }
  EXPECT_EQ(kept, (std::set<std::string>{"b1", "b2", "b_tanh"}));
  // The written model: region a's Q/DQ, none of b's.
  const std::string exported = testing::read_text(work_ / "q.onnx");
  EXPECT_NE(exported.find("a_relu_QuantizeLinear"), std::string::npos);
  EXPECT_EQ(exported.find("b_relu_QuantizeLinear"), std::string::npos);
  EXPECT_NE(exported.find("w_a1_quantized"), std::string::npos);
  EXPECT_EQ(exported.find("w_b1_quantized"), std::string::npos) << "region b's weights stay float";
  const auto& row = rep.at("latency").at("rows")[0];
  const double speedup = row.at("float_ms").get<double>() / row.at("export_ms").get<double>();
  EXPECT_GT(speedup, 3.0);
  EXPECT_LT(speedup, 22.0 / 2.0 + 3.0);
}

// Regions a and b each run faster float alone (2 ms against 22) but slower float together
// (42 ms); c is faster quantized. The check of the choice together undoes it: all stay quantized.
TEST_F(LatencySearch, RegionsFasterAloneButSlowerTogetherStayQuantized) {
  const auto r = quantize({"a", "b", "c"}, "2 + (q.c ? 0 : 40) + (q.a && q.b ? 20 : (q.a || q.b ? 0 : 40))");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto search = report().at("latency").at("search");
  ASSERT_TRUE(search.at("ran").get<bool>()) << search.dump();
  EXPECT_TRUE(search.at("reverted").get<bool>()) << search.dump();
  EXPECT_NEAR(search.at("speedup_together")[0].get<double>(), 22.0 / 42.0, 0.15);
  for (const auto& [nodes, made] : made_float()) EXPECT_FALSE(made) << nodes;
  EXPECT_TRUE(report().at("kept_float").empty());
  const std::string exported = testing::read_text(work_ / "q.onnx");
  for (const char* r : {"a", "b", "c"})
    EXPECT_NE(exported.find(std::string(r) + "_relu_QuantizeLinear"), std::string::npos) << r << " restored";
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
  EXPECT_TRUE(c.latency.search);
  EXPECT_NE(testing::error_of([] { Config::from_string("[latency]\nregions = 0", "t.toml"); }).find("latency.regions"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { Config::from_string("[latency]\nsearch = 1", "t.toml"); }).find("latency.search"),
            std::string::npos);
  EXPECT_FALSE(Config::from_string("[latency]\nsearch = false", "t.toml").latency.search);
}

}  // namespace
}  // namespace sparsebit
