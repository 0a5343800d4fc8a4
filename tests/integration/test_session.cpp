// Note [Session]: every host drives one Session, so the same config gives the same network
// whichever host runs it: the CLI's quantize, profile and simplify against an application's own
// Session here, byte for byte. And two Sessions with different plugin sets live in one process.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sparsebit/core/distributed.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/session.h"
#include "test_support.h"

namespace sparsebit {
namespace {

const std::string kImages = std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz";
// A model with a BatchNormalization left for the simplify passes to fold.
const std::string kDetector = testing::source_path("examples/ocr/text_detector.onnx");

// Pruned first, then quantized with ranges chosen per layer: a host that skipped a step of the
// Session's (preparation, the config's observer) would quantize another network.
const char* kConfig = R"(
backend = "tensorrt"
[sparse]
sparser = "l1_structured"
ratio = 0.25
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-symmetric"
observer = "auto"
[calibration]
batch_size = 16
count = 48
[latency]
enabled = false
)";

std::string cli(const std::string& args) {
  const auto r = testing::run_cli("-q " + args);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return r.output;
}

/// The plugins built with this tree, and no others (the environment's are the tests' business).
Config with_shipped_plugins(Config c) {
  c.plugins.use_environment = false;
  return c;
}

TEST(Session, QuantizeProfileAndSimplifyGiveWhatTheCommandsGive) {
  use_one_blas_thread();  // as the command does: products split otherwise round otherwise
  testing::TempDir work;
  testing::write_text(work / "c.toml", kConfig);
  const Session session(with_shipped_plugins(Config::from_file(work / "c.toml")));
  const DataSource calib(kImages);
  QuantModel qm = session.quant_model(session.prepare(session.load(testing::fixture_model(), calib), calib), calib);
  const CalibrationStats stats = session.calibrate(qm, calib);
  EXPECT_EQ(stats.samples, 48);

  cli("quantize " + testing::fixture_model() + " -c " + (work / "c.toml") + " --calib " + kImages + " -o " +
      (work / "q.onnx"));
  EXPECT_EQ(testing::read_text(work / "q.onnx"), qm.serialize()) << "the command and the Session export alike";

  ProfileOptions options;
  options.samples = 16;
  const ProfileReport mine = session.profile(qm, calib, options);
  cli("profile " + testing::fixture_model() + " -c " + (work / "c.toml") + " --calib " + kImages + " --samples 16 -o " +
      (work / "p"));
  auto theirs = nlohmann::json::parse(testing::read_text(work / "p.json"));
  auto ours = nlohmann::json::parse(profile_json(mine));
  ASSERT_EQ(theirs["single"].size(), ours["single"].size());
  ASSERT_FALSE(ours["single"].empty());
  for (std::size_t i = 0; i < ours["single"].size(); ++i) {
    EXPECT_EQ(theirs["single"][i]["node"], ours["single"][i]["node"]);
    EXPECT_DOUBLE_EQ(theirs["single"][i]["mse"].get<double>(), ours["single"][i]["mse"].get<double>())
        << ours["single"][i]["node"];
  }
  EXPECT_DOUBLE_EQ(theirs["all_layers_at_output"]["mse"].get<double>(),
                   ours["all_layers_at_output"]["mse"].get<double>());

  Model simplified = session.read(kDetector, 13);
  session.simplify(simplified);
  cli("simplify " + kDetector + " -c " + (work / "c.toml") + " -o " + (work / "s.onnx"));
  EXPECT_EQ(testing::read_text(work / "s.onnx"), serialize_onnx(simplified.graph, simplified.meta));
}

// The later steps as Session methods (held-out samples, target, agreement, export) give the
// command's export and report with a target as well.
TEST(Session, TargetAgreementAndExportStepsGiveWhatTheCommandGives) {
  use_one_blas_thread();
  testing::TempDir work;
  testing::write_text(work / "t.toml", std::string(kConfig) + "[target]\nmetric = \"cosine\"\nvalue = 0.99999\n");
  const Session session(with_shipped_plugins(Config::from_file(work / "t.toml")));
  const DataSource calib(kImages);
  Model model = session.prepare(session.load(testing::fixture_model(), calib), calib);
  const std::int64_t holdout = session.target_holdout(calib, model);
  EXPECT_EQ(holdout, 16) << "the target's default holdout";
  QuantModel qm = session.quant_model(std::move(model), session.calibration_samples(calib, holdout));
  CalibrationStats stats;
  std::vector<InputCoverage> coverage;
  const TargetReport target = session.meet_target(qm, calib, holdout, stats, &coverage);
  EXPECT_EQ(stats.samples, 48) << "calibrated on [calibration] count samples after the held-out ones";
  EXPECT_EQ(target.samples, 16);
  EXPECT_GT(target.after, target.before) << "a target this tight remedies some layers";
  const AgreementCheck agreement = session.check_agreement(qm, calib, holdout);
  EXPECT_TRUE(agreement.held_out);
  std::string external;
  const std::string bytes = session.export_onnx(qm, &external, "");
  EXPECT_TRUE(external.empty());

  cli("quantize " + testing::fixture_model() + " -c " + (work / "t.toml") + " --calib " + kImages + " -o " +
      (work / "q.onnx") + " --report " + (work / "r.json"));
  EXPECT_EQ(testing::read_text(work / "q.onnx"), bytes) << "the command and the Session's steps export alike";
  const auto report = nlohmann::json::parse(testing::read_text(work / "r.json"));
  EXPECT_EQ(report["target"]["fallback_layers"].size(), target.fallback_layers.size());
  EXPECT_DOUBLE_EQ(report["target"]["after"].get<double>(), target.after);
  EXPECT_FALSE(session.search_latency(qm, testing::fixture_model(), calib)) << "[latency] is off";
  EXPECT_FALSE(session.time_export(testing::fixture_model(), bytes, external, qm, calib));

  const Session untargeted(with_shipped_plugins(Config()));
  EXPECT_EQ(untargeted.target_holdout(calib, untargeted.load(testing::fixture_model(), calib)), 0);
  try {
    untargeted.meet_target(qm, calib, 0, stats);
    ADD_FAILURE() << "meet_target without [target]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[target]"), std::string::npos) << e.what();
  }
  testing::write_text(work / "top1.toml", std::string(kConfig) + "[target]\nmetric = \"top1-drop\"\nvalue = 1\n");
  const Session top1(with_shipped_plugins(Config::from_file(work / "top1.toml")));
  try {
    top1.meet_target(qm, calib, 0, stats);
    ADD_FAILURE() << "top1-drop without labelled data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--eval-labels"), std::string::npos) << e.what();
  }
}

TEST(Session, TwoSessionsWithDifferentPluginsLiveInOneProcess) {
  Config all = with_shipped_plugins(Config());
  Config without_simplify = all;
  without_simplify.plugins.disable = {"sparsebit.passes.simplify"};
  const Session a(all);
  const Session b(without_simplify);
  auto simplified_nodes = [](const Session& s) {
    Model m = s.read(kDetector, 13);
    s.simplify(m);
    return m.graph.num_nodes();
  };
  const std::size_t nodes = load_onnx(kDetector, ImportOptions{13, &a.registry()}).graph.num_nodes();
  const std::size_t with_a = simplified_nodes(a), with_b = simplified_nodes(b);
  EXPECT_LT(with_a, nodes) << "the simplify plugin's passes fold the exporter's leftovers";
  EXPECT_EQ(with_b, nodes) << "without the plugin its passes do not run";
  EXPECT_EQ(simplified_nodes(a), with_a) << "a second Session changed nothing in the first";
  EXPECT_NE(a.registry().pass("fuse_bn"), nullptr);
  EXPECT_EQ(b.registry().pass("fuse_bn"), nullptr);
}

}  // namespace
}  // namespace sparsebit
