// Config parsing: defaults, every key, and errors that name the key and suggest a fix.

#include <gtest/gtest.h>

#include "sparsebit/core/config.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

std::string error_of(const std::string& toml) {
  try {
    Config::from_string(toml, "test.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ShippedConfigsParse) {
  for (const char* name : {"configs/w8a8_tensorrt.toml", "configs/w8a8_onnxruntime.toml"}) {
    Config c = Config::from_file(testing::source_path(name));
    EXPECT_EQ(c.w.bits, 8) << name;
    EXPECT_TRUE(c.w.spec(true, 0).per_channel) << name;
    EXPECT_EQ(c.calibration.count, 512) << name;
  }
  Config trt = Config::from_file(testing::source_path("configs/w8a8_tensorrt.toml"));
  EXPECT_EQ(trt.backend, "tensorrt");
  EXPECT_TRUE(trt.a.spec(false, 1).symmetric);
  Config ort = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
  EXPECT_FALSE(ort.a.spec(false, 1).symmetric);
}

TEST(Config, Float8TypesAreEightBitSymmetricPerTensorOrPerChannel) {
  Config c = Config::from_file(testing::source_path("configs/fp8_tensorrt.toml"));
  QSpec w = c.w.spec(true, 0), a = c.a.spec(false, 1);
  EXPECT_EQ(w.element, QElement::kFloat8E4M3FN);
  EXPECT_TRUE(w.per_channel && w.symmetric);
  EXPECT_EQ(a.element, QElement::kFloat8E4M3FN);
  EXPECT_EQ(a.qmax(), 448);
  Config e5 = Config::from_string(
      "[w]\ntype = \"fp8_e5m2\"\n[[specific]]\nnodes = [\"x\"]\nw = { type = \"int\", bits = 4 }\n", "t.toml");
  EXPECT_EQ(e5.w.spec(true, 0).element, QElement::kFloat8E5M2);
  EXPECT_EQ(e5.specific[0].w.spec(true, 0).element, QElement::kInt);
  EXPECT_EQ(e5.specific[0].w.bits, 4);
  EXPECT_EQ(Config().w.type, "int");

  EXPECT_NE(error_of("[w]\ntype = \"fp8_e4m4\"\n").find("did you mean 'fp8_e4m3'"), std::string::npos);
  EXPECT_NE(error_of("[w]\ntype = \"fp8_e4m3\"\nqscheme = \"per-channel-affine\"\n").find("per-channel-symmetric"),
            std::string::npos);
  EXPECT_NE(error_of("[w]\ntype = \"fp8_e4m3\"\nqscheme = \"per-group-symmetric\"\ngroup_size = 32\n")
                .find("per-tensor or per-channel"),
            std::string::npos);
  EXPECT_NE(error_of("[w]\ntype = \"fp8_e4m3\"\nbits = 4\n").find("remove bits = 4"), std::string::npos);
  // Inherited: a [[specific]] entry that narrows an FP8 table must say type = "int".
  EXPECT_NE(error_of("[w]\ntype = \"fp8_e4m3\"\n[[specific]]\nnodes = [\"x\"]\nw = { bits = 4 }\n")
                .find("set type = \"int\" here"),
            std::string::npos);
}

TEST(Config, ScheduleAndPassesAreReadAsWritten) {
  // Which names are passes is the registry's to say (tests/plugin_host/test_pass_schedule.cpp).
  Config c = Config::from_string(R"(
[passes]
extra = ["my_pass"]
order = ["my_pass", "fuse_bn"]
[passes.my_pass]
strength = 3
[schedule]
fuse_gelu = false
my_pass = true
)",
                                 "p.toml");
  EXPECT_EQ(c.passes.extra, std::vector<std::string>{"my_pass"});
  EXPECT_EQ(c.passes.order, (std::vector<std::string>{"my_pass", "fuse_bn"}));
  EXPECT_EQ(c.passes.options.at("my_pass").get_int("strength", 0), 3);
  EXPECT_EQ(c.passes.switched("fuse_gelu"), std::optional<bool>(false));
  EXPECT_EQ(c.passes.switched("my_pass"), std::optional<bool>(true));
  EXPECT_EQ(c.passes.switched("fuse_bn"), std::nullopt);
  try {
    Config::from_string("[schedule]\nfuse_bn = 1\n", "p.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fuse_bn"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("true or false"), std::string::npos) << e.what();
  }
  try {
    Config::from_string("[passes]\nmy_pass = 1\n", "p.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[passes]"), std::string::npos) << e.what();
  }
}

TEST(Config, ReadsEveryKey) {
  Config c = Config::from_string(R"(
backend = "onnxruntime"
skip = ["fc*"]
[w]
qscheme = "per-tensor-affine"
bits = 4
observer = "minmax"
quantizer = "uniform"
narrow_range = true
[w.observer_options]
alpha = 0.5
[a]
disable = true
[schedule]
disable_unnecessary_quant = false
[calibration]
batch_size = 7
count = 100
device = "cpu"
mode = "layerwise"
cuda_graph = false
[plugins]
paths = ["extra"]
enable = ["sparsebit.*"]
disable = ["*.minmax"]
[qat]
tf32 = true
cache_teacher = true
cuda_graph = true
deterministic = true
)",
                                 "/cfg/dir/test.toml");
  EXPECT_EQ(c.backend, "onnxruntime");
  EXPECT_EQ(c.skip, std::vector<std::string>{"fc*"});
  QSpec w = c.w.spec(true, 0);
  EXPECT_EQ(w.bits, 4);
  EXPECT_FALSE(w.symmetric);
  EXPECT_FALSE(w.per_channel);
  EXPECT_TRUE(w.narrow_range);
  EXPECT_DOUBLE_EQ(c.w.observer_options.get_double("alpha", 0), 0.5);
  EXPECT_TRUE(c.a.disable);
  const Config defaults;
  EXPECT_EQ(c.passes.switched("disable_unnecessary_quant"), std::optional<bool>(false));
  EXPECT_EQ(c.calibration.batch_size, 7);
  EXPECT_EQ(c.calibration.count, 100);
  EXPECT_EQ(c.calibration.mode, "layerwise");
  EXPECT_FALSE(c.calibration.cuda_graph);
  EXPECT_TRUE(defaults.calibration.cuda_graph);  // recorded reconstruction steps replay the eager arithmetic
  EXPECT_EQ(c.plugins.paths, std::vector<std::string>{"/cfg/dir/extra"});  // relative to the config
  EXPECT_EQ(c.plugins.disable, std::vector<std::string>{"*.minmax"});
  EXPECT_TRUE(c.qat.tf32);
  EXPECT_TRUE(c.qat.cache_teacher);
  EXPECT_TRUE(c.qat.cuda_graph);
  EXPECT_TRUE(c.qat.deterministic);
  EXPECT_FALSE(defaults.qat.cuda_graph);
  EXPECT_FALSE(defaults.qat.deterministic);
  EXPECT_FALSE(defaults.qat.tf32);  // training in full FP32 unless asked
  const std::string e = error_of("[qat]\ntf32 = \"yes\"\n");
  EXPECT_NE(e.find("tf32"), std::string::npos) << e;
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
  const std::string g = error_of("[calibration]\ncuda_graph = 1\n");
  EXPECT_NE(g.find("calibration.cuda_graph"), std::string::npos) << g;
  EXPECT_NE(g.find("true or false"), std::string::npos) << g;
}

TEST(Config, UnknownKeysSuggestTheNearestValidKey) {
  std::string e = error_of("[w]\nqschem = \"per-tensor-symmetric\"\n");
  EXPECT_NE(e.find("unknown key 'qschem'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'qscheme'"), std::string::npos) << e;
  EXPECT_NE(e.find("test.toml"), std::string::npos) << e;
  e = error_of("bakend = \"tensorrt\"\n");
  EXPECT_NE(e.find("did you mean 'backend'"), std::string::npos) << e;
  e = error_of("[calibration]\nbatchsize = 3\n");
  EXPECT_NE(e.find("did you mean 'batch_size'"), std::string::npos) << e;
  e = error_of("[plugin]\npaths = []\n");
  EXPECT_NE(e.find("did you mean 'plugins'"), std::string::npos) << e;
}

// toml++ nests a table per dotted part and recurses through them: 100,000 parts ended in a
// stack overflow. Keys that deep are refused first, naming the line; dots inside strings,
// comments, numbers and dates are not key parts.
TEST(Config, KeysOfManyDottedPartsAreRefusedBeforeParsing) {
  std::string deep = "backend = \"virtual\"\n# a.b.c\n";
  for (int i = 0; i < 100000; ++i) deep += "a.";
  for (const std::string& text : {deep + "a = 1\n", "backend = \"virtual\"\n\n[" + deep.substr(30) + "a]\n"}) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find("test.toml:3"), std::string::npos) << e.substr(0, 200);
    EXPECT_NE(e.find("dotted parts"), std::string::npos) << e.substr(0, 200);
  }
  std::string dots(200, '.');
  const Config c = Config::from_string(
      "skip = [\"" + dots + "\", '" + dots + "']  # " + dots + "\n[a.observer_options]\nalpha = 1.5e-3\n", "test.toml");
  EXPECT_EQ(c.skip.size(), 2u);
}

TEST(Config, GroupSizesBeyondAnyRowAreRefusedAtLoad) {
  const std::string e =
      error_of("[w]\nqscheme = \"per-group-symmetric\"\nbits = 4\ngroup_size = 9223372036854775807\n");
  EXPECT_NE(e.find("w.group_size"), std::string::npos) << e;
  EXPECT_NE(e.find("per-channel-symmetric"), std::string::npos) << e;
}

// Integers kept in 32 bits are range-checked at load: 2^32 + 2 samples used to calibrate on 2.
TEST(Config, IntegersBeyondTheirFieldAreRefusedNotTruncated) {
  std::string e = error_of("[calibration]\ncount = 4294967298\n");
  EXPECT_NE(e.find("calibration.count must be 0 (all) to 2147483647, got 4294967298"), std::string::npos) << e;
  e = error_of("[calibration]\nbatch_size = 4294967300\n");
  EXPECT_NE(e.find("calibration.batch_size must be 1 to 1048576"), std::string::npos) << e;
  e = error_of("[qat]\nepochs = 4294967297\n");
  EXPECT_NE(e.find("qat.epochs must be 1 to"), std::string::npos) << e;
  EXPECT_EQ(Config::from_string("[calibration]\ncount = 2147483647\n", "t.toml").calibration.count, 2147483647);
}

TEST(Config, BadValuesNameTheKey) {
  EXPECT_NE(error_of("[w]\nbits = \"eight\"\n").find("w.bits must be an integer"), std::string::npos);
  EXPECT_NE(error_of("[w]\nbits = 1\n").find("between 2 and 16"), std::string::npos);
  std::string e = error_of("[a]\nqscheme = \"per-tensor-symetric\"\n");
  EXPECT_NE(e.find("did you mean 'per-tensor-symmetric'"), std::string::npos) << e;
  EXPECT_NE(error_of("[calibration]\nmode = \"fast\"\n").find("calibration.mode"), std::string::npos);
  EXPECT_NE(error_of("[plugins]\npaths = \"x\"\n").find("plugins.paths must be an array"), std::string::npos);
  EXPECT_NE(error_of("backend = \n").find("invalid TOML"), std::string::npos);
  EXPECT_THROW(Config::from_file("/nonexistent/config.toml"), Error);
}

TEST(Config, NearestOnlySuggestsCloseKeys) {
  EXPECT_EQ(nearest("qschem", {"qscheme", "bits"}), "qscheme");
  EXPECT_EQ(nearest("zzzzzzzz", {"qscheme", "bits"}), "");
}

}  // namespace
}  // namespace sparsebit

namespace sparsebit {
namespace {

TEST(Config, SpecificEntriesMergeOverTheGlobalTables) {
  Config c = Config::from_string(R"(
[w]
bits = 8
observer = "minmax"
[a]
observer = "percentile"
[a.observer_options]
alpha = 0.001
[[specific]]
nodes = "/fc2*"
w = { bits = 4 }
[[specific]]
nodes = ["/conv1/*", "/dw3/*"]
a = { observer = "mse" }
w = { qscheme = "per-tensor-symmetric" }
)",
                                 "test.toml");
  ASSERT_EQ(c.specific.size(), 2u);
  EXPECT_EQ(c.specific[0].nodes, std::vector<std::string>{"/fc2*"});
  EXPECT_EQ(c.specific[0].w.bits, 4);
  EXPECT_EQ(c.specific[0].w.qscheme, "per-channel-symmetric");  // inherited
  EXPECT_EQ(c.specific[0].a.observer, "percentile");            // inherited with its options
  EXPECT_TRUE(c.specific[0].a.observer_options.has("alpha"));
  EXPECT_EQ(c.specific[1].a.observer, "mse");
  EXPECT_FALSE(c.specific[1].a.observer_options.has("alpha"));  // options were for percentile
  EXPECT_FALSE(c.specific[1].w.spec(true, 0).per_channel);
  EXPECT_EQ(c.specific[1].w.bits, 8);
}

TEST(Config, PerGroupSchemesNeedAGroupSizeAndWeights) {
  Config c = Config::from_string("[w]\nqscheme = \"per-group-symmetric\"\ngroup_size = 32\n", "g.toml");
  QSpec s = c.w.spec(true, 0);
  EXPECT_EQ(s.group_size, 32);
  EXPECT_EQ(s.group_axis, 1);                  // Conv / Gemm(transB) weights: input axis 1
  EXPECT_EQ(c.w.spec(true, 1).group_axis, 0);  // MatMul / Gemm weights [K, N]: input axis 0
  EXPECT_NE(error_of("[w]\nqscheme = \"per-group-affine\"\n").find("w.group_size must be set"), std::string::npos);
  EXPECT_NE(error_of("[a]\nqscheme = \"per-group-affine\"\ngroup_size = 8\n").find("for weights"), std::string::npos);
}

TEST(Config, SpecificEntryErrorsNameTheEntryAndKey) {
  EXPECT_NE(error_of("[[specific]]\nw = { bits = 4 }\n").find("specific[0].nodes is required"), std::string::npos);
  std::string e = error_of("[[specific]]\nnodes = \"x\"\nw = { bitz = 4 }\n");
  EXPECT_NE(e.find("specific[0].w"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'bits'"), std::string::npos) << e;
  e = error_of("[[specific]]\nnode = \"x\"\n");
  EXPECT_NE(e.find("did you mean 'nodes'"), std::string::npos) << e;
  EXPECT_NE(error_of("[[specific]]\nnodes = \"x\"\nw = 4\n").find("must be a table"), std::string::npos);
}

}  // namespace
}  // namespace sparsebit
