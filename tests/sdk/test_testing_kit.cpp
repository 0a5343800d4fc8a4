// The SDK's test kit (sparsebit/sdk/testing.h, Note [Plugin test kit]): a built plugin opened and
// checked as the host opens it, its objects made as the host makes them, and what the host
// refuses refused with the file and the reason named.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "sparsebit/sdk/testing.h"

namespace sparsebit::testing {
namespace {

const std::string kBuilt = SPARSEBIT_BUILT_PLUGINS;
const std::string kFixtures = SPARSEBIT_FIXTURE_PLUGINS;

TEST(TestKit, OpensAPluginAndMakesItsObjectsAsTheHostDoes) {
  const PluginUnderTest ops(kBuilt + "/sparsebit_ops_activation.so");
  EXPECT_EQ(ops.name(), "sparsebit.ops.activation");
  EXPECT_EQ(ops.registered().ops.count(":Relu"), 1u);
  const at::Tensor x = at::tensor({-2.0f, 0.0f, 3.0f});
  EXPECT_TRUE(at::equal(OneNode("Relu").run(ops, {x}).at(0), at::tensor({0.0f, 0.0f, 3.0f})));
  // LeakyRelu with alpha 0.5, by hand: -2 -> -1.
  const at::Tensor leaky = OneNode("LeakyRelu").attr("alpha", Attribute::of_float(0.5)).run(ops, {x}).at(0);
  EXPECT_TRUE(at::equal(leaky, at::tensor({-1.0f, 0.0f, 3.0f}))) << leaky;
  EXPECT_NE(thrown_message([&] { ops.op("NoSuchOp"); }).find("registers no op ':NoSuchOp'"), std::string::npos);

  const PluginUnderTest minmax(kBuilt + "/sparsebit_observer_minmax.so");
  QSpec spec;  // 8-bit symmetric: scale = 2 * max|x| / 255
  auto observer = minmax.observer("minmax", spec);
  observer->observe(x);
  EXPECT_FLOAT_EQ(observer->compute().scale.item<float>(), 2 * 3.0f / 255);
  Options typo("[a.observer_options]");
  typo.set("averaging", true);
  const std::string refused = thrown_message([&] { minmax.observer("minmax", spec, typo); });
  EXPECT_NE(refused.find("[a.observer_options]: key averaging not understood by observer 'minmax'"), std::string::npos)
      << refused;
}

TEST(TestKit, RefusesWhatTheHostRefusesNamingTheFile) {
  auto refusal = [](const std::string& file) {
    return thrown_message([&] { PluginUnderTest plugin(kFixtures + "/" + file); });
  };
  const std::string newer = refusal("fixture_wrong_sdk.so");
  EXPECT_NE(newer.find("fixture_wrong_sdk.so"), std::string::npos) << newer;
  EXPECT_NE(newer.find("SDK 1." + std::to_string(sdk::kSdkVersionMinor + 1)), std::string::npos) << newer;
  EXPECT_NE(refusal("fixture_wrong_abi.so").find("ABI version"), std::string::npos);
  EXPECT_NE(refusal("fixture_no_entry.so").find("SPARSEBIT_PLUGIN missing"), std::string::npos);
  EXPECT_NE(refusal("no_such_plugin.so").find("does not load"), std::string::npos);
  // Registering one name twice within a plugin, as the host refuses a clash.
  RecordingRegistrar r;
  r.add_observer_factory("twice", nullptr);
  EXPECT_NE(
      thrown_message([&] { r.add_observer_factory("twice", nullptr); }).find("observer 'twice' is registered twice"),
      std::string::npos);
}

}  // namespace
}  // namespace sparsebit::testing
