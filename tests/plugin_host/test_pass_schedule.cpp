// Passes known by their plugins (Note [Pass schedule]): the default schedule is what the loaded
// plugins register, a vendor's pass is placed and configured as a shipped one, names in
// [schedule] and [passes] are checked against the registry, and a disabled plugin takes its
// passes with it.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>

#include "sparsebit/core/passes.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using testing::error_of;

Config config(const std::string& text) { return Config::from_string(text, "schedule.toml"); }

std::vector<std::string> enabled(const std::vector<ScheduleEntry>& schedule) {
  std::vector<std::string> on;
  for (const auto& e : schedule)
    if (e.enabled) on.push_back(e.pass);
  return on;
}

const ScheduleEntry& entry(const std::vector<ScheduleEntry>& schedule, const std::string& pass) {
  for (const auto& e : schedule)
    if (e.pass == pass) return e;
  throw Error("no pass " + pass + " in the schedule");
}

/// The shipped plugins and the fixtures (the vendor's acme plugin, the faulty one's unplaced pass).
class PassSchedules : public ::testing::Test {
 protected:
  void SetUp() override {
    PluginSearch s;
    s.paths = {SPARSEBIT_FIXTURE_PLUGINS};
    s.use_environment = false;
    s.disable = {"fixture.duplicate_op"};
    registry_.load(s);
  }
  Registry registry_;
};

TEST(PassSchedule, TheShippedPluginsGiveTheDocumentedDefaults) {
  // docs/PASSES.md's table, in its order: on for every backend, or for ONNX Runtime only.
  const std::vector<std::string> order{"remove_identity",
                                       "fold_constants",
                                       "fuse_hardsigmoid",
                                       "fuse_bn",
                                       "fuse_affine",
                                       "fuse_matmul_add",
                                       "fuse_hardswish",
                                       "fuse_gelu",
                                       "fuse_layernorm",
                                       "fuse_pad",
                                       "fuse_activations",
                                       "move_transposes",
                                       "merge_transposes",
                                       "cross_layer_equalization",
                                       "smooth_quant",
                                       "awq",
                                       "disable_unnecessary_quant",
                                       "float_norms_and_heads",
                                       "float_attention_scores",
                                       "bias_correction"};
  const auto tensorrt = resolve_schedule(config("backend = \"tensorrt\"\n"), testing::shipped_registry());
  ASSERT_EQ(tensorrt.size(), order.size());
  for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(tensorrt[i].pass, order[i]);
  const std::vector<std::string> everywhere{"remove_identity",      "fold_constants",   "fuse_bn",
                                            "fuse_matmul_add",      "fuse_hardswish",   "fuse_gelu",
                                            "fuse_layernorm",       "fuse_pad",         "fuse_activations",
                                            "move_transposes",      "merge_transposes", "disable_unnecessary_quant",
                                            "float_norms_and_heads"};
  EXPECT_EQ(enabled(tensorrt), everywhere);
  const auto ort = resolve_schedule(config("backend = \"onnxruntime\"\n"), testing::shipped_registry());
  std::vector<std::string> with_ort = everywhere;
  with_ort.insert(with_ort.begin() + 2, "fuse_hardsigmoid");
  with_ort.insert(with_ort.begin() + 4, "fuse_affine");
  EXPECT_EQ(enabled(ort), with_ort);
}

TEST(PassSchedule, EveryShippedConfigNamesOnlyRegisteredPasses) {
  int checked = 0;
  for (const char* folder : {"configs", "examples"}) {
    for (const auto& f : std::filesystem::recursive_directory_iterator(testing::source_path(folder))) {
      if (f.path().extension() != ".toml" || f.path().string().find("plugin-template") != std::string::npos) continue;
      const Config c = Config::from_file(f.path().string());
      EXPECT_NO_THROW(resolve_schedule(c, testing::shipped_registry())) << f.path();
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
}

TEST_F(PassSchedules, AVendorsPassIsPlacedSwitchedAndConfiguredAsAShippedOne) {
  const auto defaults = resolve_schedule(Config(), registry_);
  ASSERT_GE(defaults.size(), 3u);
  // Registered at order 150: between remove_identity (100) and fold_constants (200), on.
  EXPECT_EQ(defaults[1].pass, "acme_drop_unit_scale");
  EXPECT_TRUE(defaults[1].enabled);
  // A pass registered without a place comes after the placed ones, off until the config says.
  EXPECT_EQ(defaults.back().pass, "throwing_pass");
  EXPECT_FALSE(defaults.back().enabled);

  const auto set = resolve_schedule(config("[schedule]\nacme_drop_unit_scale = false\nthrowing_pass = true\n"
                                           "[passes]\norder = [\"fuse_bn\"]\n[passes.fuse_gelu]\nstrength = 3\n"),
                                    registry_);
  EXPECT_FALSE(entry(set, "acme_drop_unit_scale").enabled);
  EXPECT_TRUE(entry(set, "throwing_pass").enabled);
  EXPECT_EQ(set.front().pass, "fuse_bn");
  EXPECT_EQ(entry(set, "fuse_gelu").options.get_int("strength", 0), 3);
  EXPECT_TRUE(
      entry(resolve_schedule(config("[passes]\nextra = [\"throwing_pass\"]\n"), registry_), "throwing_pass").enabled);

  // In a run it does what it says: com.acme:ChannelScale by ones is gone, by other values kept.
  for (const double s : {1.0, 2.0}) {
    testing::Builder b({1, 4, 3, 3});
    b.g.opset_imports["com.acme"] = 1;
    b.constant("s", at::full({4}, s));
    b.add("scale", "ChannelScale", {"x", "s"}, {"a"})->domain = "com.acme";
    b.add("relu", "Relu", {"a"}, {"y"});
    QuantModel qm(Model{b.g.clone(), ModelMeta{}}, config("backend = \"virtual\"\n"), registry_);
    EXPECT_EQ(qm.graph().num_nodes(), s == 1.0 ? 1u : 2u) << "scale " << s;
  }
}

TEST_F(PassSchedules, NamesNoPluginRegistersAreRefusedWithTheNearestOne) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"[schedule]\nfuse_bnn = true\n",
       "[schedule] fuse_bnn: no loaded plugin registers a pass 'fuse_bnn' "
       "(did you mean 'fuse_bn'?)"},
      {"[schedule]\nacme_drop_unit_scal = false\n", "did you mean 'acme_drop_unit_scale'?"},
      {"[passes]\norder = [\"fuse_gelo\"]\n", "[passes] order: no loaded plugin registers a pass 'fuse_gelo'"},
      {"[passes.smooth_qant]\nalpha = 0.5\n", "[passes.smooth_qant]: no loaded plugin registers"},
      {"[passes]\nextra = [\"fuse_bn\"]\n", "'fuse_bn' is already scheduled by its plugin"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { resolve_schedule(config(c.first), registry_); });
    EXPECT_NE(msg.find("schedule.toml"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.second), std::string::npos) << msg;
  }
  // bn_tuning is the pipeline's own step, switched like a pass.
  EXPECT_NO_THROW(resolve_schedule(config("[schedule]\nbn_tuning = true\n"), registry_));
  // A value of [passes] other than extra and order must be a table of options.
  EXPECT_NE(error_of([] { config("[passes]\nmy_pass = 1\n"); }).find("[passes.my_pass]"), std::string::npos);
}

TEST(PassSchedule, ADisabledPluginTakesItsDefaultPassesWithIt) {
  Registry registry;
  PluginSearch s;
  s.use_environment = false;
  s.disable = {"sparsebit.passes.simplify"};
  registry.load(s);
  const auto schedule = resolve_schedule(Config(), registry);
  for (const char* pass : {"fuse_bn", "fold_constants", "fuse_gelu"})
    EXPECT_THROW(entry(schedule, pass), Error) << pass;
  EXPECT_TRUE(entry(schedule, "merge_transposes").enabled);
  // Asking for one of them by name is refused, naming the plugin that is not loaded.
  const std::string msg = error_of([&] { resolve_schedule(config("[schedule]\nfuse_bn = true\n"), registry); });
  EXPECT_NE(msg.find("sparsebit.passes.simplify"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparsebit
