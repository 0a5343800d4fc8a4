// The original toolkit's YAML configs (Note [YAML configs]) against the TOML a user would write
// by hand for the same settings, the errors that name the YAML key, and the torch module paths
// node globs match.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/glob.h"
#include "sparsebit/core/config.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

Config from_yaml(const std::string& yaml) {
  return Config::from_string(yaml_config_to_toml(yaml, "test.yaml"), "test.yaml");
}

std::string yaml_error(const std::string& yaml) {
  try {
    from_yaml(yaml);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_same_table(const QuantTableConfig& a, const QuantTableConfig& b, const std::string& what) {
  EXPECT_EQ(a.qscheme, b.qscheme) << what;
  EXPECT_EQ(a.bits, b.bits) << what;
  EXPECT_EQ(a.quantizer, b.quantizer) << what;
  EXPECT_EQ(a.observer, b.observer) << what;
  EXPECT_EQ(a.disable, b.disable) << what;
}

bool schedule_on(const Config& c, const std::string& pass) {
  if (pass == "bn_tuning") return c.passes.switched(pass).value_or(false);
  for (const auto& e : resolve_schedule(c, testing::shipped_registry()))
    if (e.pass == pass) return e.enabled;
  ADD_FAILURE() << "no pass " << pass;
  return false;
}

// A QAT config in the original's schema (4-bit LSQ, activations' observer options, per-module
// overrides on each side) and the TOML it means.
const char* kQatYaml = R"(
BACKEND: virtual
SKIP_TRACE_MODULES: ["blocks.*.drop_path"]
SCHEDULE:
  BN_TUNING: True
W:
  QSCHEME: per-channel-symmetric
  QUANTIZER:
    TYPE: lsq
    BIT: 4
  SPECIFIC: [{
    "stem*": ["QUANTIZER.BIT", 8],
  }]
A:
  QSCHEME: per-tensor-affine
  QUANTIZER:
    TYPE: LSQ+
    BIT: 4
  OBSERVER:
    TYPE: PERCENTILE
    PERCENTILE:
      ALPHA: 0.01
  SPECIFIC: [{
    "stem*": ["QUANTIZER.BIT", 8, "OBSERVER.TYPE", "ACIQ", "OBSERVER.ACIQ.DISTRIBUTION", "laplace"],
    "*norm*": ["QUANTIZER.DISABLE", True],
    "head": ["QUANTIZER.BIT", 0],
  }]
)";

const char* kQatToml = R"(
backend = "virtual"
[schedule]
fuse_bn = false
bn_tuning = true
[w]
qscheme = "per-channel-symmetric"
bits = 4
quantizer = "lsq"
observer = "minmax"
[a]
qscheme = "per-tensor-affine"
bits = 4
quantizer = "lsq_plus"
observer = "percentile"
observer_options = { alpha = 0.01 }
[[specific]]
nodes = "stem*"
w = { bits = 8 }
[[specific]]
nodes = "stem*"
a = { bits = 8, observer = "aciq", observer_options = { distribution = "laplace" } }
[[specific]]
nodes = "*norm*"
a = { disable = true }
[[specific]]
nodes = "head"
a = { disable = true }
)";

TEST(YamlConfig, OriginalSchemaMeansTheSameAsTheTomlWrittenByHand) {
  const Config y = from_yaml(kQatYaml);
  const Config t = Config::from_string(kQatToml, "test.toml");
  EXPECT_EQ(y.backend, t.backend);
  expect_same_table(y.w, t.w, "w");
  expect_same_table(y.a, t.a, "a");
  EXPECT_EQ(y.a.observer_options.get_double("alpha", 0), 0.01);
  for (const char* pass : {"fuse_bn", "bn_tuning", "disable_unnecessary_quant"})
    EXPECT_EQ(schedule_on(y, pass), schedule_on(t, pass)) << pass;
  EXPECT_FALSE(schedule_on(y, "fuse_bn"));  // the original folds BatchNorm only when asked
  ASSERT_EQ(y.specific.size(), t.specific.size());
  for (std::size_t i = 0; i < y.specific.size(); ++i) {
    const auto& a = y.specific[i];
    const auto& b = t.specific[i];
    EXPECT_EQ(a.nodes, b.nodes) << i;
    EXPECT_EQ(a.sets_w, b.sets_w) << i;
    EXPECT_EQ(a.sets_a, b.sets_a) << i;
    if (a.sets_w) expect_same_table(a.w, b.w, "specific w " + std::to_string(i));
    if (a.sets_a && !a.a.disable) expect_same_table(a.a, b.a, "specific a " + std::to_string(i));
    if (a.sets_a) EXPECT_EQ(a.a.disable, b.a.disable) << i;
  }
  // The W entry sets weights only, the A entry activations only: each side keeps its own first match.
  EXPECT_TRUE(y.specific[0].sets_w && !y.specific[0].sets_a);
  EXPECT_TRUE(!y.specific[1].sets_w && y.specific[1].sets_a);
  EXPECT_EQ(y.specific[1].a.observer_options.get_string("distribution", ""), "laplace");
}

TEST(YamlConfig, PtqExampleWithDefaults) {
  const Config c = from_yaml(R"(
BACKEND: tensorrt
SCHEDULE:
  FUSE_BN: True
W:
  QSCHEME: per-channel-symmetric
  QUANTIZER: {TYPE: uniform, BIT: 8}
  OBSERVER: {TYPE: MINMAX}
A:
  QSCHEME: per-tensor-symmetric
  QUANTIZER: {TYPE: uniform, BIT: 8}
  OBSERVER: {TYPE: MSE, LAYOUT: NLC}
)");
  EXPECT_EQ(c.backend, "tensorrt");
  EXPECT_TRUE(schedule_on(c, "fuse_bn"));
  EXPECT_TRUE(schedule_on(c, "disable_unnecessary_quant"));
  EXPECT_FALSE(schedule_on(c, "bn_tuning"));
  EXPECT_EQ(c.a.observer, "mse");
  EXPECT_EQ(c.w.quantizer, "uniform");
  EXPECT_EQ(c.a.bits, 8);
  EXPECT_TRUE(c.specific.empty());
}

TEST(YamlConfig, KeysWithoutAnEquivalentAreRefusedByName) {
  const std::string base = "W: {QSCHEME: per-channel-symmetric, QUANTIZER: {BIT: 8}}\n";
  const std::string a8 = "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8}}\n";
  struct Case {
    std::string yaml, expect;
  };
  for (const Case& c : std::vector<Case>{
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8}, QADD: {ENABLE_QUANT: True}}\n",
            "A.QADD.ENABLE_QUANT: not supported"},
           {base + a8 + "SCHEDULE: {BIT_ALLOCATION: {ENABLE: True}}\n",
            "SCHEDULE.BIT_ALLOCATION: ENABLE needs AVG_WEIGHT_BIT_TARGET"},
           {base + a8 + "SCHEDULE: {BIT_ALLOCATION: {ENABLE: True, AVG_WEIGHT_BIT: 4}}\n",
            "did you mean SCHEDULE.BIT_ALLOCATION.AVG_WEIGHT_BIT_TARGET?"},
           {base + a8 + "SCHEDULE: {BIT_ALLOCATION: {ENABLE: True, AVG_WEIGHT_BIT_TARGET: 3}}\n",
            "avg_weight_bits = 3.000000 is outside the choices (4 to 8 bits)"},
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {TYPE: lsq}}\n", "A.QUANTIZER.BIT: must be set"},
           {base + "a: {QSCHEME: per-tensor-affine}\n", "did you mean A?"},
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8}, OBSERVER: {TYPE: HISTOGRAM}}\n",
            "A.OBSERVER.TYPE: 'HISTOGRAM' is not an observer"},
           {base + "A: {QSCHEME: per-group-affine, QUANTIZER: {BIT: 8}}\n", "A.QSCHEME: 'per-group-affine'"},
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8, TRAINING: {ENABLE: True}}}\n",
            "A.QUANTIZER.TRAINING.ENABLE: not supported"},
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8}, SPECIFIC: [{x: [\"QUANTIZER.BIT\", 4]}, "
                   "{y: [\"QUANTIZER.BIT\", 4]}]}\n",
            "reads only the first"},
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8}, SPECIFIC: [{x: [\"QUANTIZER.BIT\"]}]}\n",
            "A.SPECIFIC['x']: must be a list of KEY, value pairs"},
           {base + "A: {QSCHEME: per-tensor-affine, QUANTIZER: {BIT: 8}, SPECIFIC: [{x: [\"QUANTIZER.BITS\", 4]}]}\n",
            "did you mean A.SPECIFIC['x'].QUANTIZER.BIT?"},
           {base + a8 + "SCHEDULE: {BN_TUNING: True}\n" /* fine */, ""},
           {"W: {QSCHEME: per-tensor-symmetric, QUANTIZER: {BIT: 8}}\n" + a8 + "SCHEDULE: {BN_TUNING: True}\n",
            "SCHEDULE.BN_TUNING: needs per-channel weights"},
           {base, "A is missing"},
           {"W: [1, 2\n", "test.yaml:"},
       }) {
    const std::string e = yaml_error(c.yaml);
    if (c.expect.empty()) {
      EXPECT_EQ(e, "") << c.yaml;
      continue;
    }
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.yaml << "\n -> " << e;
    EXPECT_EQ(e.rfind("test.yaml", 0), 0u) << e;  // the file, and the line where there is one
  }
}

TEST(YamlConfig, BitAllocationBecomesItsTable) {
  const std::string sides =
      "W: {QSCHEME: per-channel-symmetric, QUANTIZER: {BIT: 8}}\nA: {QSCHEME: per-tensor-affine, QUANTIZER: "
      "{BIT: 8}}\n";
  const Config on = from_yaml(sides +
                              "SCHEDULE: {BIT_ALLOCATION: {ENABLE: True, AVG_WEIGHT_BIT_TARGET: 5.5, "
                              "AVG_FEATURE_BIT_TARGET: 8}}\n");
  ASSERT_TRUE(on.bit_allocation.has_value());
  EXPECT_EQ(*on.bit_allocation->avg_weight_bits, 5.5);
  EXPECT_EQ(*on.bit_allocation->avg_activation_bits, 8.0);
  EXPECT_EQ(on.bit_allocation->choices, (std::vector<int>{4, 8}));
  const Config off = from_yaml(sides + "SCHEDULE: {BIT_ALLOCATION: {ENABLE: False, AVG_WEIGHT_BIT_TARGET: 5}}\n");
  EXPECT_FALSE(off.bit_allocation.has_value());
}

// The example configs in the original's schema: each reads, and the TOML `config convert`
// writes for it reads back to the same settings.
TEST(YamlConfig, ExamplesRoundTripThroughTheirToml) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(testing::source_path("examples/original_yaml"))) {
    if (!is_yaml_config(e.path().string())) continue;
    ++files;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string toml = yaml_config_to_toml(text.str(), e.path().string());
    EXPECT_EQ(toml, yaml_config_to_toml(text.str(), e.path().string()));  // the same text every time
    const Config y = Config::from_file(e.path().string());
    const Config t = Config::from_string(toml, "converted.toml");
    const Config again = Config::from_string(toml, "again.toml");
    const std::string what = e.path().filename().string();
    EXPECT_EQ(y.backend, t.backend) << what;
    expect_same_table(y.w, t.w, what + " w");
    expect_same_table(y.a, t.a, what + " a");
    expect_same_table(t.w, again.w, what + " w again");
    ASSERT_EQ(y.specific.size(), t.specific.size()) << what;
    for (std::size_t i = 0; i < y.specific.size(); ++i) {
      EXPECT_EQ(y.specific[i].nodes, t.specific[i].nodes) << what;
      expect_same_table(y.specific[i].w, t.specific[i].w, what + " specific w");
      expect_same_table(y.specific[i].a, t.specific[i].a, what + " specific a");
    }
    for (const auto& entry : resolve_schedule(y, testing::shipped_registry()))
      EXPECT_EQ(entry.enabled, schedule_on(t, entry.pass)) << what << entry.pass;
    EXPECT_EQ(y.passes.switched("bn_tuning"), t.passes.switched("bn_tuning")) << what;
    EXPECT_EQ(y.bit_allocation.has_value(), t.bit_allocation.has_value()) << what;
  }
  EXPECT_GE(files, 4);
  const Config lsq = Config::from_file(testing::source_path("examples/original_yaml/qat_lsq_4bit.yaml"));
  EXPECT_EQ(lsq.a.quantizer, "lsq_plus");
  EXPECT_EQ(lsq.a.observer, "mse");
  ASSERT_EQ(lsq.specific.size(), 4u);
  EXPECT_EQ(lsq.specific[2].a.observer, "minmax");
  const Config pact = Config::from_file(testing::source_path("examples/original_yaml/qat_pact_dorefa.yaml"));
  EXPECT_EQ(pact.a.quantizer_options.get_double("alpha", 0), 6.0);
  EXPECT_EQ(pact.a.observer_options.get_double("ema_ratio", 0), 0.95);
  EXPECT_TRUE(schedule_on(pact, "bn_tuning"));
  const Config mixed = Config::from_file(testing::source_path("examples/original_yaml/ptq_bit_allocation.yaml"));
  ASSERT_TRUE(mixed.bit_allocation.has_value());
  EXPECT_EQ(*mixed.bit_allocation->avg_weight_bits, 6.0);
  EXPECT_EQ(mixed.a.observer_options.get_string("distribution", ""), "laplace");
}

TEST(YamlConfig, BitZeroTurnsASideOff) {
  const Config c = from_yaml(
      "W: {QSCHEME: per-channel-symmetric, QUANTIZER: {BIT: 4}}\nA: {QSCHEME: per-tensor-affine, QUANTIZER: "
      "{BIT: 0}}\n");
  EXPECT_TRUE(c.a.disable);
  EXPECT_FALSE(c.w.disable);
  EXPECT_EQ(c.w.bits, 4);
}

TEST(YamlConfig, FilesAreReadByExtension) {
  EXPECT_TRUE(is_yaml_config("dir/qconfig.yaml"));
  EXPECT_TRUE(is_yaml_config("Q.YML"));
  EXPECT_FALSE(is_yaml_config("configs/w8a8_tensorrt.toml"));
}

TEST(ModulePath, ReadFromTorchOnnxScopeNames) {
  EXPECT_EQ(module_path_of("/backbone/backbone.0/Conv"), "backbone.0");        // torch 1.x: full paths
  EXPECT_EQ(module_path_of("/layer1/layer1.0/conv1/Conv"), "layer1.0.conv1");  // torchvision's resnet18
  EXPECT_EQ(module_path_of("/layer2/layer2.0/downsample/downsample.0/Conv"), "layer2.0.downsample.0");
  EXPECT_EQ(module_path_of("/model/layers.0/self_attn/MatMul_1"), "model.layers.0.self_attn");  // names
  EXPECT_EQ(module_path_of("/head/head.fc/Gemm"), "head.fc");
  EXPECT_EQ(module_path_of("/Flatten"), "");        // the top-level module
  EXPECT_EQ(module_path_of("conv2d_1.tmp_0"), "");  // another exporter
  EXPECT_EQ(module_path_of("/a b/Conv"), "");       // not a module path
  EXPECT_EQ(module_path_of("//Conv"), "");
}

TEST(ModulePath, NodeGlobsMatchNamesModulesAndFxSpelling) {
  const std::string conv = "/backbone/backbone.0/Conv";
  EXPECT_TRUE(node_matches_any(conv, {"backbone*"}));
  EXPECT_TRUE(node_matches_any(conv, {"backbone.0"}));
  EXPECT_TRUE(node_matches_any(conv, {"backbone_0"}));  // torch.fx's node name
  EXPECT_TRUE(node_matches_any(conv, {"/backbone/*"}));
  EXPECT_FALSE(node_matches_any(conv, {"backbone.1"}));
  EXPECT_FALSE(node_matches_any(conv, {"head*"}));
  EXPECT_TRUE(node_matches_any("/head/head.fc/Gemm", {"head.fc"}));
  EXPECT_FALSE(node_matches_any("/head/head.fc/Gemm", {"head.f"}));
  EXPECT_FALSE(node_matches_any("/Flatten", {""}));
}

}  // namespace
}  // namespace sparsebit
