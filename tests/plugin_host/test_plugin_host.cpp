// The plugin host's gates: each broken fixture is refused with the file and the reason, and
// every other plugin still loads.

#include <gtest/gtest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "prune_testing.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/version.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;

const PluginRecord* find(const Registry& r, const std::string& file_part) {
  for (const auto& p : r.plugins())
    if (p.file.find(file_part) != std::string::npos) return &p;
  return nullptr;
}

class PluginHost : public ::testing::Test {
 protected:
  void SetUp() override {
    PluginSearch s;
    s.paths = {SPARSEBIT_FIXTURE_PLUGINS};  // fixtures first, then the shipped plugins
    s.use_environment = false;
    registry_.load(s);
  }
  Registry registry_;
};

TEST_F(PluginHost, GoodPluginsLoadBesideBrokenOnes) {
  const PluginRecord* good = find(registry_, "fixture_good_extra");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, PluginRecord::Status::kLoaded) << good->reason;
  EXPECT_TRUE(registry_.observer("fixture_zero"));
  EXPECT_TRUE(registry_.observer("minmax"));
  EXPECT_TRUE(registry_.op("Conv", ""));
}

TEST_F(PluginHost, WrongAbiIsRefusedNamingBothValues) {
  const PluginRecord* p = find(registry_, "fixture_wrong_abi");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "abi_version");
  const std::string plugin_abi = "ABI version " + std::to_string(sdk::kAbiVersion + 41);
  EXPECT_NE(p->reason.find(plugin_abi), std::string::npos) << p->reason;
  EXPECT_NE(p->reason.find("host has " + std::to_string(sdk::kAbiVersion)), std::string::npos) << p->reason;
}

// The case the ABI lock exists for: a plugin built one SDK bump ago.
TEST_F(PluginHost, PluginBuiltAgainstThePreviousAbiIsRefusedNamingBothNumbers) {
  const PluginRecord* p = find(registry_, "fixture_previous_abi");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "abi_version");
  EXPECT_NE(p->reason.find("ABI version " + std::to_string(sdk::kAbiVersion - 1)), std::string::npos) << p->reason;
  EXPECT_NE(p->reason.find("host has " + std::to_string(sdk::kAbiVersion)), std::string::npos) << p->reason;
}

TEST_F(PluginHost, WrongFingerprintIsRefusedBeforeItsCodeRuns) {
  const PluginRecord* p = find(registry_, "fixture_wrong_torch");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "torch_version");
  EXPECT_NE(p->reason.find("LibTorch 0.4"), std::string::npos) << p->reason;
  EXPECT_NE(p->reason.find("fixture.wrong_torch"), std::string::npos) << p->reason;
}

TEST_F(PluginHost, NewerSdkMinorIsRefused) {
  const PluginRecord* p = find(registry_, "fixture_wrong_sdk");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->gate, "sdk_version");
  const std::string newer =
      "SDK " + std::to_string(sdk::kSdkVersionMajor) + "." + std::to_string(sdk::kSdkVersionMinor + 1);
  EXPECT_NE(p->reason.find(newer), std::string::npos) << p->reason;
}

// A plugin built against the last release's headers (tests/plugin_host/released) loads, and its
// optional roles are found and run: observed, merged, solved, by hand-checked numbers.
TEST_F(PluginHost, PluginOfTheLastReleaseRunsWithItsRoles) {
  const PluginRecord* p = find(registry_, "fixture_released_sdk");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kLoaded) << p->reason;
  EXPECT_EQ(p->sdk_version.substr(0, p->sdk_version.find('.')), std::to_string(sdk::kSdkVersionMajor));
  const auto* obs = registry_.observer("fixture_released_absmax");
  const auto* quant = registry_.quantizer("fixture_released_rounding");
  ASSERT_TRUE(obs && quant);

  QSpec spec;  // symmetric int8: scale = 2 absmax / 255 (Note [Quantization arithmetic])
  spec.is_weight = true;
  const Options options("[test]");
  auto first = obs->factory(ObserverContext{spec, options, "w"});
  auto second = obs->factory(ObserverContext{spec, options, "w"});
  first->observe(at::tensor({0.5f, -2.0f}));
  second->observe(at::tensor({2.55f, 1.0f}));
  testing::role<MergeableObserver>(first).merge(testing::role<MergeableObserver>(second).state());
  const QParams merged = first->compute();
  EXPECT_FLOAT_EQ(merged.scale.item<float>(), 2 * 2.55f / 255);  // the range of both

  auto q = quant->factory(QuantizerContext{spec, options, "w"});
  q->initialize(merged);
  auto& solver = testing::role<SolvedFromInputs>(q);
  EXPECT_EQ(dynamic_cast<ReconstructedByLayer*>(q.get()), nullptr);  // a role it does not have
  solver.accumulate_inputs(at::zeros({3, 4}));
  solver.accumulate_inputs(at::zeros({5, 4}));
  solver.solve(at::zeros({4, 2}), 0);
  EXPECT_EQ(q->parameters().at(0).item<double>(), 8.0);
  const float s = merged.scale.item<float>();
  const at::Tensor w = at::tensor({0.26f, -1.0f, 2.55f});  // 13, -50 and 127.5 steps: 128 clamps to 127
  const at::Tensor by_hand = at::tensor({13 * s, -50 * s, 127 * s});
  EXPECT_TRUE(at::allclose(q->forward(w), by_hand, 1e-6, 1e-6)) << q->forward(w);
}

TEST_F(PluginHost, OtherCxxAbiFlagIsRefusedNamingBothValues) {
  const PluginRecord* p = find(registry_, "fixture_wrong_cxx_abi");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "cxx11_abi");
  const int host = host_fingerprint().cxx11_abi;
  EXPECT_NE(p->reason.find("_GLIBCXX_USE_CXX11_ABI=" + std::to_string(1 - host)), std::string::npos) << p->reason;
  EXPECT_NE(p->reason.find("host has " + std::to_string(host)), std::string::npos) << p->reason;
}

TEST_F(PluginHost, MissingEntrySymbolIsRefused) {
  const PluginRecord* p = find(registry_, "fixture_no_entry");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "entry_symbol");
  EXPECT_NE(p->reason.find("sparsebit_plugin_descriptor"), std::string::npos) << p->reason;
}

TEST_F(PluginHost, ThrowingRegisterLeavesNothingBehind) {
  const PluginRecord* p = find(registry_, "fixture_throwing_register");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "register");
  EXPECT_NE(p->reason.find("fixture failure during registration"), std::string::npos) << p->reason;
  EXPECT_FALSE(registry_.observer("fixture_half_registered"));  // staged, never committed
}

// conv1 -> com.acme:<op>(a, s) -> Pad (spatial) -> conv2: the vendor's op between two layers
// (fixture_third_party_op), in a model of the given opset.
testing::Builder acme_block(const std::string& op, std::int64_t opset = 17) {
  testing::Builder b({1, 3, 4, 4}, opset);
  b.g.opset_imports["com.acme"] = 1;
  at::manual_seed(11);
  b.constant("w1", at::randn({8, 3, 1, 1}));
  b.constant("s", at::rand({8}) + 0.5);
  b.constant("w2", at::randn({2, 8, 1, 1}));
  const std::vector<std::int64_t> pads = {0, 0, 1, 1, 0, 0, 1, 1};
  b.add("conv1", "Conv", {"x", "w1"}, {"a"});
  b.add("scale", op, {"a", "s"}, {"b"})->domain = "com.acme";
  if (opset >= 11) {
    b.constant("pads", at::tensor(pads));
    b.add("pad", "Pad", {"b", "pads"}, {"c"});
  } else {  // before opset 11 the pads are an attribute
    b.add("pad", "Pad", {"b"}, {"c"}, {{"pads", Attribute::of_ints(pads)}});
  }
  b.add("conv2", "Conv", {"c", "w2"}, {"y"});
  return b;
}

PruneResult prune_half(const Graph& g, const Registry& registry) {
  Model m{g.clone(), {}};
  at::manual_seed(7);
  return prune(m, testing::sparse_config("[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n"), registry,
               {at::randn({1, 3, 4, 4})});
}

TEST_F(PluginHost, AThirdPartyOpIsPrunedThroughByItsChannelFlow) {
  const testing::Builder b = acme_block("ChannelScale");
  ASSERT_TRUE(registry_.op_trait<ChannelFlow>("ChannelScale", "com.acme"));
  const PruneResult r = prune_half(b.g, registry_);
  EXPECT_EQ(r.channels_removed, 4);
  // conv1 is the group's only producer: its 4 filters of largest L1 norm stay, and the vendor's
  // per-channel constant and conv2's input channels are sliced with them.
  const auto& o = b.g.initializers;
  const at::Tensor keep = std::get<0>(std::get<1>(o.at("w1").abs().sum({1, 2, 3}).topk(4)).sort());
  const auto& p = r.pruned.graph.initializers;
  EXPECT_TRUE(at::equal(p.at("w1"), o.at("w1").index_select(0, keep)));
  EXPECT_TRUE(at::equal(p.at("s"), o.at("s").index_select(0, keep)));
  EXPECT_TRUE(at::equal(p.at("w2"), o.at("w2").index_select(1, keep)));
  const at::Tensor x = at::randn({2, 3, 4, 4});
  Executor pruned(r.pruned.graph, registry_), masked(r.masked.graph, registry_);
  EXPECT_TRUE(at::allclose(pruned.run({{"x", x}})[0], masked.run({{"x", x}})[0], 1e-5, 1e-5));
}

// conv1 (3 -> 8) -> com.acme:Pointwise (8 -> 6, with a bias) -> conv2 (6 -> 2): the vendor's
// layer is told apart by its WeightedLayer trait alone, and channel removal slices it as the
// consumer of conv1's channels and the producer of its own.
TEST_F(PluginHost, AThirdPartyLayerIsPrunedAsAProducerAndAConsumer) {
  testing::Builder b({1, 3, 4, 4}, 17);
  b.g.opset_imports["com.acme"] = 1;
  at::manual_seed(13);
  b.constant("w1", at::randn({8, 3, 1, 1}));
  b.constant("wp", at::randn({6, 8}));
  b.constant("bp", at::randn({6}));
  b.constant("w2", at::randn({2, 6, 1, 1}));
  b.add("conv1", "Conv", {"x", "w1"}, {"a"});
  b.add("dense", "Pointwise", {"a", "wp", "bp"}, {"b"})->domain = "com.acme";
  b.add("conv2", "Conv", {"b", "w2"}, {"y"});
  ASSERT_TRUE(registry_.op_trait<WeightedLayer>("Pointwise", "com.acme"));
  const PruneResult r = prune_half(b.g, registry_);
  EXPECT_EQ(r.channels_removed, 4 + 3);
  // Each layer alone produces its channels: those of largest L1 norm stay (l1_structured).
  const auto& o = b.g.initializers;
  auto kept = [](const at::Tensor& w, std::int64_t k) {
    return std::get<0>(std::get<1>(w.abs().flatten(1).sum(1).topk(k)).sort());
  };
  const at::Tensor keep1 = kept(o.at("w1"), 4), keep_p = kept(o.at("wp"), 3);
  const auto& p = r.pruned.graph.initializers;
  EXPECT_TRUE(at::equal(p.at("w1"), o.at("w1").index_select(0, keep1)));
  EXPECT_TRUE(at::equal(p.at("wp"), o.at("wp").index_select(0, keep_p).index_select(1, keep1)));
  EXPECT_TRUE(at::equal(p.at("bp"), o.at("bp").index_select(0, keep_p)));
  EXPECT_TRUE(at::equal(p.at("w2"), o.at("w2").index_select(1, keep_p)));
  // The pruned model computes what the masked one does, and what torch does on the kept weights.
  const at::Tensor x = at::randn({2, 3, 4, 4});
  Executor pruned(r.pruned.graph, registry_), masked(r.masked.graph, registry_);
  const at::Tensor y = pruned.run({{"x", x}})[0];
  EXPECT_TRUE(at::allclose(y, masked.run({{"x", x}})[0], 1e-5, 1e-5));
  const at::Tensor a = at::conv2d(x, p.at("w1"));
  const at::Tensor d = at::conv2d(a, p.at("wp").view({3, 4, 1, 1}), p.at("bp"));
  EXPECT_TRUE(at::allclose(y, at::conv2d(d, p.at("w2")), 1e-5, 1e-5));
}

// GPTQ solves a layer's 2-D weight from the layer's inputs wherever the layer reads its
// features: the vendor's layer, along axis 1 of an image (its WeightedLayer axes).
TEST_F(PluginHost, AThirdPartyLayersWeightIsSolvedByGptqFromItsInputs) {
  testing::Builder b({16, 8, 6, 6}, 17);
  b.g.opset_imports["com.acme"] = 1;
  at::manual_seed(17);
  b.constant("wp", at::randn({12, 8}) * 0.3);
  b.add("dense", "Pointwise", {"x", "wp"}, {"y"})->domain = "com.acme";
  const Config c = Config::from_string(
      "[w]\nqscheme = \"per-channel-symmetric\"\nbits = 3\nquantizer = \"gptq\"\n"
      "[calibration]\nmode = \"asym\"\nbatch_size = 16\n",
      "gptq.toml");
  QuantModel qm(Model{b.g.clone(), {}}, c, registry_);
  // Features mixed from 3 latent ones: correlated, as real activations are (with independent
  // features rounding to nearest is already optimal).
  const at::Tensor mix = at::randn({8, 3});
  const at::Tensor latent = at::randn({16, 3, 6, 6});
  const at::Tensor x = at::einsum("ck,nkhw->nchw", {mix, latent}) + 0.05 * at::randn({16, 8, 6, 6});
  testing::TempDir dir;
  write_npy(x, dir / "x.npy");
  auto data = open_dataset(dir.path().string(), qm.graph().inputs);
  const CalibrationStats stats = qm.calibrate(*data);
  ASSERT_EQ(stats.reconstructions.size(), 1u);
  EXPECT_EQ(stats.reconstructions[0].node, "dense");
  EXPECT_LT(stats.reconstructions[0].mse_learnt, stats.reconstructions[0].mse_nearest);
}

// Lifting opset 10 -> 13 rewrites Pad's attribute into an input typed like its data, the vendor
// op's output: its type comes from running the model on a sample, which runs the vendor's op.
TEST_F(PluginHost, AThirdPartyOpIsLiftedThroughAndThenPrunedThrough) {
  const testing::Builder b = acme_block("ChannelScale", 10);
  Model m{b.g.clone(), {}};
  const LiftReport lift = lift_model(m, 13, registry_, {at::randn({1, 3, 4, 4})});
  EXPECT_EQ(lift.to, 13);
  EXPECT_TRUE(lift.checked);
  EXPECT_EQ(lift.max_abs_diff, 0.0);
  const Node* pad = m.graph.find_node("pad");
  ASSERT_TRUE(pad && pad->has_input(1));
  EXPECT_TRUE(at::equal(m.graph.initializers.at(pad->inputs[1]),
                        at::tensor(std::vector<std::int64_t>{0, 0, 1, 1, 0, 0, 1, 1})));
  const PruneResult r = prune_half(m.graph, registry_);
  EXPECT_EQ(r.channels_removed, 4);
  EXPECT_EQ(r.pruned.graph.initializers.at("s").size(0), 4);
}

// LpNormalization of the default domain is run by the vendor's plugin alone, which says its
// meaning never changed: an opset-10 model using it lifts to 13, and runs as torch computes it.
TEST_F(PluginHost, AVendorsOpOfTheDefaultDomainIsLiftedByTheRulesItGives) {
  testing::Builder b({1, 3, 4, 4}, 10);
  at::manual_seed(5);
  b.constant("w", at::randn({4, 3, 1, 1}));
  b.add("conv", "Conv", {"x", "w"}, {"a"});
  b.add("norm", "LpNormalization", {"a"}, {"y"}, {{"axis", Attribute::of_int(1)}});
  Model m{b.g.clone(), {}};
  const at::Tensor x = at::randn({1, 3, 4, 4});
  const LiftReport lift = lift_model(m, 13, registry_, {x});
  EXPECT_EQ(lift.to, 13);
  EXPECT_TRUE(lift.checked);
  EXPECT_EQ(m.graph.default_opset(), 13);
  const at::Tensor a = at::conv2d(x, b.g.initializers.at("w"));
  const at::Tensor expected = a / a.norm(2, {1}, true);
  Executor ex(m.graph, registry_);
  EXPECT_TRUE(at::allclose(ex.run({{"x", x}}).at(0), expected, 1e-5, 1e-6));
}

// A default-domain op that a plugin runs without lifting rules, or that no plugin runs, stops the
// lift naming the node, the op and the plugin.
TEST_F(PluginHost, AnOpWithoutLiftingRulesStopsTheLiftNamingItsPlugin) {
  testing::Builder b({1, 3, 4, 4}, 10);
  b.add("vendor", "Opaque", {"x"}, {"y"});
  Graph no_rules = b.g.clone();
  no_rules.find_node("vendor")->op_type = "SimplifiedLayerNormalization";  // run by the contrib plugin
  std::string why = testing::error_of([&] { lift_opset(no_rules, 13, OpTraitTable(registry_)); });
  EXPECT_NE(why.find("node 'vendor' (SimplifiedLayerNormalization) cannot be lifted from opset 10 to 13: plugin "
                     "'sparsebit.ops.contrib', which registers SimplifiedLayerNormalization, gives no lifting rules"),
            std::string::npos)
      << why;
  Graph nobody = b.g.clone();
  nobody.find_node("vendor")->op_type = "MaxRoiPool";
  why = testing::error_of([&] { lift_opset(nobody, 13, OpTraitTable(registry_)); });
  EXPECT_NE(why.find("no loaded plugin registers MaxRoiPool"), std::string::npos) << why;
  EXPECT_EQ(nobody.default_opset(), 10);
}

TEST_F(PluginHost, AThirdPartyOpWithoutChannelFlowKeepsTheChannels) {
  const PruneResult r = prune_half(acme_block("Opaque").g, registry_);
  EXPECT_EQ(r.channels_removed, 0);
  ASSERT_EQ(r.notes.size(), 2u);  // conv2's channels are the graph output's
  EXPECT_EQ(r.notes[0], "channels of conv1: 8 of 8 kept, held by node 'scale' (com.acme:Opaque)");
}

TEST_F(PluginHost, TraitsForAnOpThePluginDoesNotRegisterAreRefused) {
  const PluginRecord* p = find(registry_, "fixture_traits_without_op");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(p->gate, "register");
  EXPECT_NE(p->reason.find("traits for op:Relu, which it does not register"), std::string::npos) << p->reason;
}

TEST_F(PluginHost, DuplicateNameIsRefusedNamingBothLibraries) {
  // Fixtures load first, so the fixture owns op:Relu and the shipped plugin is the duplicate.
  const PluginRecord* fixture = find(registry_, "fixture_duplicate_op");
  const PluginRecord* shipped = find(registry_, "sparsebit_ops_activation");
  ASSERT_TRUE(fixture && shipped);
  EXPECT_EQ(fixture->status, PluginRecord::Status::kLoaded);
  EXPECT_EQ(shipped->status, PluginRecord::Status::kRefused);
  EXPECT_EQ(shipped->gate, "duplicate");
  EXPECT_NE(shipped->reason.find("op:Relu"), std::string::npos) << shipped->reason;
  EXPECT_NE(shipped->reason.find("fixture_duplicate_op"), std::string::npos) << shipped->reason;
  EXPECT_NE(shipped->reason.find("sparsebit_ops_activation"), std::string::npos) << shipped->reason;
}

TEST(PluginHostFilters, DisableGlobsAndDiscoveryOrder) {
  Registry r;
  PluginSearch s;
  s.use_environment = false;
  s.disable = {"*.minmax"};
  r.load(s);
  EXPECT_FALSE(r.observer("minmax"));
  const PluginRecord* p = find(r, "sparsebit_observer_minmax");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, PluginRecord::Status::kDisabled);
  EXPECT_EQ(r.searched_folders().back(), Registry::default_plugin_folder());
}

// Note [Selection before loading]: a library enable/disable excludes is never opened, so its
// constructors never run; selection uses the sidecar's name, else the file name.
TEST(PluginHostFilters, ExcludedLibrariesAreNeverOpened) {
  testing::TempDir dir;
  const std::string marker = (dir.path() / "opened").string();
  setenv("SPARSEBIT_TEST_OPENED_MARKER", marker.c_str(), 1);
  int copies = 0;
  // A fresh copy per case (a library already open in this process would not run its
  // constructors again), with `sidecar` beside it unless empty.
  auto opened_with = [&](const std::string& sidecar, std::vector<std::string> enable,
                         std::vector<std::string> disable) {
    const std::filesystem::path folder = dir.path() / ("copy" + std::to_string(++copies));
    std::filesystem::create_directories(folder);
    std::filesystem::copy_file(std::string(SPARSEBIT_FIXTURE_PLUGINS) + "/fixture_constructor_marker.so",
                               folder / "fixture_constructor_marker.so");
    if (!sidecar.empty()) testing::write_text((folder / "fixture_constructor_marker.plugin").string(), sidecar + "\n");
    std::filesystem::remove(marker);
    Registry r;
    PluginSearch s;
    s.paths = {folder.string()};
    s.use_environment = false;
    s.use_default_folder = false;
    s.enable = std::move(enable);
    s.disable = std::move(disable);
    r.load(s);
    const PluginRecord* p = find(r, "constructor_marker");
    EXPECT_TRUE(p);
    return std::make_pair(std::filesystem::exists(marker), p ? *p : PluginRecord{});
  };
  // No sidecar: the file name decides.
  auto [opened, rec] = opened_with("", {}, {"*"});
  EXPECT_FALSE(opened);
  EXPECT_EQ(rec.status, PluginRecord::Status::kDisabled);
  EXPECT_NE(rec.reason.find("not opened"), std::string::npos) << rec.reason;
  std::tie(opened, rec) = opened_with("", {"sparsebit.*"}, {});
  EXPECT_FALSE(opened);
  std::tie(opened, rec) = opened_with("", {"fixture_constructor_*"}, {});
  EXPECT_TRUE(opened);
  EXPECT_EQ(rec.status, PluginRecord::Status::kLoaded) << rec.reason;
  // With a sidecar, its plugin name decides; a sidecar that disagrees with the descriptor is refused.
  std::tie(opened, rec) = opened_with("fixture.constructor_marker", {}, {"fixture.*"});
  EXPECT_FALSE(opened);
  EXPECT_NE(rec.reason.find("from its sidecar"), std::string::npos) << rec.reason;
  std::tie(opened, rec) = opened_with("fixture.constructor_marker", {"fixture.constructor_marker"}, {});
  EXPECT_TRUE(opened);
  EXPECT_EQ(rec.status, PluginRecord::Status::kLoaded) << rec.reason;
  std::tie(opened, rec) = opened_with("acme.other", {"acme.*"}, {});
  EXPECT_EQ(rec.status, PluginRecord::Status::kRefused);
  EXPECT_NE(rec.reason.find("sidecar"), std::string::npos) << rec.reason;
  unsetenv("SPARSEBIT_TEST_OPENED_MARKER");
  // The shipped plugins carry sidecars naming what their descriptors say.
  EXPECT_EQ(Registry::sidecar_name(Registry::default_plugin_folder() + "/sparsebit_observer_minmax.so").value_or(""),
            "sparsebit.observers.minmax");
}

TEST(PluginHostFilters, EnvironmentPathIsSearchedBeforeTheDefaultFolder) {
  setenv("SPARSEBIT_PLUGIN_PATH", SPARSEBIT_FIXTURE_PLUGINS, 1);
  Registry r;
  r.load({});
  unsetenv("SPARSEBIT_PLUGIN_PATH");
  ASSERT_GE(r.searched_folders().size(), 2u);
  EXPECT_EQ(r.searched_folders()[0], SPARSEBIT_FIXTURE_PLUGINS);
  EXPECT_TRUE(r.observer("fixture_zero"));
}

}  // namespace
}  // namespace sparsebit

namespace sparsebit {
namespace {

// Objects made by plugins must not depend on the registry that created them: a model built
// from a registry keeps working after the registry is destroyed, and is destroyed cleanly
// afterwards (run under AddressSanitizer by tools/test.sh).
TEST(PluginLifetime, ModelOutlivesTheRegistryThatBuiltIt) {
  Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
  c.calibration.count = 32;
  auto registry = std::make_unique<Registry>();
  PluginSearch s;
  s.use_environment = false;
  registry->load(s);
  auto qm = std::make_unique<QuantModel>(load_onnx(testing::fixture_model()), c, *registry);
  registry.reset();  // factories, tables and records are gone; the libraries stay mapped
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", qm->graph().inputs);
  qm->calibrate(*data);
  qm->set_quant(true, true);
  at::Tensor y = qm->forward({at::rand({4, 1, 28, 28})})[0];
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{4, 10}));
  testing::TempDir dir;
  qm->export_onnx(dir / "q.onnx");
  qm.reset();
  EXPECT_TRUE(fs::exists(dir / "q.onnx"));
}

}  // namespace
}  // namespace sparsebit
