// The `sparsebit` command as users run it: success paths, --help, JSON output, and every bad
// input the foundation promises a clear message for, with no output file left behind.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/pipeline.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;

using testing::run_cli;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    calib_ = work_ / "calib";
    out_ = work_ / "out";
    fs::create_directories(calib_);
    fs::create_directories(out_);
    at::manual_seed(3);
    write_npy(at::rand({16, 1, 28, 28}), calib_ + "/batch0.npy");
    write_npy(at::rand({1, 28, 28}), calib_ + "/sample1.npy");
    config_ = testing::source_path("configs/w8a8_tensorrt.toml");
  }
  std::string quantize(const std::string& model, const std::string& calib, const std::string& extra = "") {
    return "quantize " + model + " -c " + config_ + " --calib " + calib + " -o " + out_ + "/q.onnx " + extra;
  }
  // The command failed with one clear message containing every `needle`, and left no file.
  void expect_failure(const testing::CommandResult& r, const std::vector<std::string>& needles) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    for (const auto& n : needles)
      EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in:\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    EXPECT_EQ(testing::count_files(out_), 0) << "a failed run left files in " << out_;
  }

  testing::TempDir work_;
  std::string calib_, out_, config_;
};

// Note [Agreement check]: every quantize says how the quantized model agrees with float, on
// held-out samples where the data has more than [calibration] count, and warns when it is poor.
TEST_F(Cli, EveryQuantizeReportsItsAgreementWithFloat) {
  auto r = run_cli(quantize(testing::fixture_model(), calib_, "--report " + out_ + "/r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("quantized vs float on 8 calibration samples: output"), std::string::npos) << r.output;
  std::ifstream in(out_ + "/r.json");
  const auto report = nlohmann::json::parse(in);
  const auto& a = report.at("agreement");
  EXPECT_EQ(a.at("samples"), 8);
  EXPECT_FALSE(a.at("held_out").get<bool>());
  ASSERT_EQ(a.at("outputs").size(), 1u);
  const double cosine = a.at("outputs")[0].at("cosine").get<double>();
  EXPECT_GT(cosine, 0.9);
  EXPECT_LE(cosine, 1.0 + 1e-12);
  EXPECT_EQ(a.at("poor").get<bool>(), cosine < AgreementCheck::kPoorCosine);
  EXPECT_TRUE(report.at("input_coverage").empty()) << "the fixture's input has no open sample dimension";

  const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
  r = run_cli(quantize(testing::fixture_model(), images, "--calib-count 32 --report " + out_ + "/r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("quantized vs float on 8 held-out samples"), std::string::npos) << r.output;
}

TEST_F(Cli, PoorAgreementWarnsWithWhatToTry) {
  std::ofstream(out_ + "/../two_bit.toml") << "backend = \"virtual\"\n[w]\nbits = 2\n[a]\nbits = 2\n";
  auto r = run_cli("quantize " + testing::fixture_model() + " -c " + out_ + "/../two_bit.toml --calib " + calib_ +
                   " -o " + out_ + "/q.onnx");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle : {"agrees poorly with float", "sparsebit profile", "--target"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << " missing in:\n" << r.output;
}

TEST_F(Cli, NothingQuantizedWarnsLoudly) {
  std::ofstream(out_ + "/../skip_all.toml") << "skip = [\"*\"]\n[a]\nbits = 8\n";
  auto r = run_cli("quantize " + testing::fixture_model() + " -c " + out_ + "/../skip_all.toml --calib " + calib_ +
                   " -o " + out_ + "/q.onnx");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("NOTHING IS QUANTIZED: 0 quantized inputs"), std::string::npos) << r.output;
}

// Library users call the same pipeline the CLI does (Note [Pipeline order]): the same job gives
// the same model bytes and the same report, and a refused job writes nothing.
TEST_F(Cli, LibraryPipelineGivesWhatTheCliGives) {
  // One thread on both sides: the same kernels then sum in the same order, so the two runs share
  // their arithmetic and must agree to the bit (on any processor).
  auto r = run_cli("--threads 1 " +
                   quantize(testing::fixture_model(), calib_, "--report " + out_ + "/r.json --batch-size 4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  QuantizeJob job;
  job.model = testing::fixture_model();
  job.calib = calib_;
  job.config = Config::from_file(config_);
  job.config.calibration.batch_size = 4;
  job.output = out_ + "/lib.onnx";
  job.report = out_ + "/lib.json";
  std::vector<std::string> steps;
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const QuantizeOutcome outcome =
      run_quantize(job, [&](const std::string& step, std::int64_t, std::int64_t, const std::string&) {
        if (steps.empty() || steps.back() != step) steps.push_back(step);
      });
  at::set_num_threads(threads);
  EXPECT_EQ(steps, (std::vector<std::string>{"calibrating", ""}));
  EXPECT_EQ(outcome.calibration.samples, 17);
  EXPECT_EQ(testing::read_text(out_ + "/q.onnx"), testing::read_text(out_ + "/lib.onnx")) << "model bytes differ";
  auto cli_report = nlohmann::json::parse(testing::read_text(out_ + "/r.json"));
  auto lib_report = nlohmann::json::parse(testing::read_text(out_ + "/lib.json"));
  EXPECT_EQ(nlohmann::json::parse(report_json(outcome)), lib_report);
  for (auto* report : {&cli_report, &lib_report}) {  // what is measured, not computed
    std::vector<std::string> phases;
    for (const auto& [name, seconds] : (*report)["phase_seconds"].items()) {
      phases.push_back(name);
      EXPECT_GE(seconds.get<double>(), 0.0) << name;
    }
    EXPECT_EQ(phases, (std::vector<std::string>{"agreement", "calibration", "export", "load", "parameters", "passes"}));
    report->erase("phase_seconds");
    report->erase("import_ms");
    (*report)["calibration"].erase("seconds");
    (*report)["calibration"]["range_selection"].erase("seconds");
  }
  EXPECT_EQ(cli_report, lib_report);

  PruneJob prune_job;  // no [sparse] table: refused before any file is claimed
  prune_job.model = testing::fixture_model();
  prune_job.config = Config::from_file(config_);
  prune_job.output = out_ + "/pruned.onnx";
  const std::string message = testing::error_of([&] { run_prune(prune_job); });
  EXPECT_NE(message.find("no [sparse] table"), std::string::npos) << message;
  EXPECT_NE(message.find("w8a8_tensorrt.toml"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(out_ + "/pruned.onnx"));
}

TEST_F(Cli, QuantizeWritesModelAndReport) {
  auto r = run_cli(quantize(testing::fixture_model(), calib_, "--report " + out_ + "/r.json --batch-size 4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ + "/q.onnx"));
  std::ifstream in(out_ + "/r.json");
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["calibration"]["samples"], 17);
  EXPECT_EQ(j["calibration"]["batches"], 5);
  EXPECT_EQ(j["backend"], "tensorrt");
  EXPECT_GT(j["quantized_inputs"].size(), 10u);
  EXPECT_EQ(testing::count_files(out_), 2);  // no temporary files left
}

TEST_F(Cli, InspectReadsBackNarrowBitWidths) {
  testing::write_text(work_ / "w4a6.toml", "backend = \"virtual\"\n[w]\nbits = 4\n[a]\nbits = 6\n");
  config_ = work_ / "w4a6.toml";
  ASSERT_EQ(run_cli(quantize(testing::fixture_model(), calib_)).exit_code, 0);
  auto r = run_cli("inspect --json " + out_ + "/q.onnx");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["quantization"]["narrow_bits"]["image"], 6);
  EXPECT_EQ(j["quantization"]["narrow_bits"]["fc2.weight"], 4);
  EXPECT_GT(j["quantization"]["qdq_nodes"].get<int>(), 20);
  r = run_cli("inspect " + out_ + "/q.onnx");
  EXPECT_NE(r.output.find("image: 6 bits"), std::string::npos) << r.output;
}

TEST_F(Cli, HelpOnEveryCommand) {
  for (const char* cmd : {"--help", "quantize --help", "plugins --help", "inspect --help", "prune --help"}) {
    auto r = run_cli(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd;
  }
  EXPECT_NE(run_cli("").exit_code, 0);
}

TEST_F(Cli, PluginsAndInspectJson) {
  auto r = run_cli("plugins --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  bool conv = false;
  for (const auto& p : j["plugins"]) {
    EXPECT_EQ(p["status"], "loaded") << p.dump();
    for (const auto& reg : p["registered"]) conv = conv || reg == "op:Conv";
  }
  EXPECT_TRUE(conv);
  // The pass schedule the loaded plugins give (Note [Pass schedule]).
  ASSERT_FALSE(j["schedule"]["passes"].empty());
  EXPECT_EQ(j["schedule"]["passes"][0]["pass"], "remove_identity");
  EXPECT_EQ(j["schedule"]["passes"][0]["order"], 100);
  EXPECT_TRUE(j["schedule"]["passes"][0]["enabled"].get<bool>());
  testing::write_text(work_ / "typo.toml", "[schedule]\nfuse_bnn = false\n");
  expect_failure(run_cli("quantize " + testing::fixture_model() + " -c " + work_ / "typo.toml" + " --calib " + calib_ +
                         " -o " + out_ + "/q.onnx"),
                 {"typo.toml", "[schedule] fuse_bnn", "did you mean 'fuse_bn'"});
  r = run_cli("inspect --json " + testing::fixture_model());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["inputs"][0]["name"], "image");
  EXPECT_EQ(j["inputs"][0]["shape"][0], "batch");
  EXPECT_EQ(j["inputs"][0]["shape"][3], 28);
  for (const auto& op : j["ops"]) EXPECT_TRUE(op["qmodule"].get<bool>()) << op.dump();
  r = run_cli("inspect " + std::string(ONNX_TESTDATA_DIR) + "/node/test_nllloss_NC/model.onnx");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("MISSING"), std::string::npos) << r.output;
}

TEST_F(Cli, NotOnnxAndTruncatedOnnx) {
  testing::write_text(work_ / "fake.onnx", "definitely not a model");
  expect_failure(run_cli(quantize(work_ / "fake.onnx", calib_)), {"fake.onnx", "not a valid ONNX model"});
  std::ifstream in(testing::fixture_model(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(work_ / "cut.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  expect_failure(run_cli(quantize(work_ / "cut.onnx", calib_)), {"cut.onnx"});
  expect_failure(run_cli(quantize(work_ / "missing.onnx", calib_)), {"missing.onnx", "no such file"});
}

TEST_F(Cli, OpWithoutQModule) {
  expect_failure(run_cli(quantize(std::string(ONNX_TESTDATA_DIR) + "/node/test_nllloss_NC/model.onnx", calib_)),
                 {"no QModule for op NegativeLogLikelihoodLoss", "node '", "sparsebit plugins"});
}

TEST_F(Cli, UnknownConfigKey) {
  testing::write_text(work_ / "typo.toml", "backend = \"tensorrt\"\n[a]\nobserverr = \"minmax\"\n");
  config_ = work_ / "typo.toml";
  expect_failure(run_cli(quantize(testing::fixture_model(), calib_)),
                 {"typo.toml", "unknown key 'observerr'", "did you mean 'observer'"});
}

TEST_F(Cli, CalibrationDataThatDoesNotFit) {
  fs::path bad = work_.path() / "bad_shape";
  fs::create_directories(bad);
  write_npy(at::rand({4, 3, 28, 28}), (bad / "x.npy").string());
  expect_failure(run_cli(quantize(testing::fixture_model(), bad.string())), {"x.npy", "dimension 1 is 3", "needs 1"});

  fs::path dbl = work_.path() / "bad_dtype";
  fs::create_directories(dbl);
  write_npy(at::rand({4, 1, 28, 28}).to(at::kDouble), (dbl / "x.npy").string());
  expect_failure(run_cli(quantize(testing::fixture_model(), dbl.string())), {"x.npy", "double", "float"});

  fs::path empty = work_.path() / "empty";
  fs::create_directories(empty);
  expect_failure(run_cli(quantize(testing::fixture_model(), empty.string())), {"empty", "is empty"});

  fs::path nan = work_.path() / "nan";
  fs::create_directories(nan);
  at::Tensor t = at::rand({4, 1, 28, 28});
  t[1][0][3][3] = INFINITY;
  write_npy(t, (nan / "x.npy").string());
  expect_failure(run_cli(quantize(testing::fixture_model(), nan.string())), {"x.npy", "NaN or Inf", "sample: 1"});
}

TEST_F(Cli, OutputPathThatCannotBeWritten) {
  auto r = run_cli("quantize " + testing::fixture_model() + " -c " + config_ + " --calib " + calib_ +
                   " -o /nonexistent/dir/q.onnx");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent/dir/q.onnx"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  r = run_cli("quantize " + testing::fixture_model() + " -c " + config_ + " --calib " + calib_ + " -o " + out_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is a folder"), std::string::npos) << r.output;
  EXPECT_EQ(testing::count_files(out_), 0);
}

TEST_F(Cli, CudaOnACpuOnlyBuildIsAClearError) {
  if (at::hasCUDA()) GTEST_SKIP() << "this build has CUDA";
  expect_failure(run_cli(quantize(testing::fixture_model(), calib_, "--device cuda")), {"cuda", "--device cpu"});
}

TEST_F(Cli, FailedRunKeepsAnExistingOutputIntact) {
  testing::write_text(out_ + "/q.onnx", "previous");
  testing::write_text(work_ / "fake.onnx", "garbage");
  auto r = run_cli(quantize(work_ / "fake.onnx", calib_));
  EXPECT_NE(r.exit_code, 0);
  std::ifstream in(out_ + "/q.onnx");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "previous");
  EXPECT_EQ(testing::count_files(out_), 1);
}

}  // namespace
}  // namespace sparsebit

namespace sparsebit {
namespace {

TEST(CliDrawings, DotAndMermaidShowNodesEdgesAndQuantizers) {
  testing::TempDir work;
  const std::string dot = work / "m.dot", mmd = work / "m.mmd";
  auto r = run_cli("inspect " + testing::fixture_model() + " -c " + testing::source_path("configs/w8a8_tensorrt.toml") +
                   " --dot " + dot + " --mermaid " + mmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string d = testing::read_text(dot), m = testing::read_text(mmd);
  Model model = load_onnx(testing::fixture_model());
  std::size_t edges = 0;
  for (std::size_t p = d.find("->"); p != std::string::npos; p = d.find("->", p + 2)) ++edges;
  std::size_t mermaid_edges = 0;
  for (std::size_t p = m.find("-->|"); p != std::string::npos; p = m.find("-->|", p + 4)) ++mermaid_edges;
  EXPECT_EQ(d.rfind("digraph model {", 0), 0u);
  EXPECT_EQ(m.rfind("flowchart TD", 0), 0u);
  EXPECT_EQ(edges, mermaid_edges);
  EXPECT_GE(edges, model.graph.num_nodes());  // a chain at least, plus input and output edges
  for (const Node* n : model.graph.nodes()) {
    if (n->op_type == "BatchNormalization") continue;  // folded into its conv by fuse_bn
    EXPECT_NE(d.find(n->name), std::string::npos) << n->name;
    EXPECT_NE(m.find(n->name), std::string::npos) << n->name;
  }
  EXPECT_NE(d.find("8b per-channel-symmetric minmax/uniform"), std::string::npos);
  EXPECT_NE(d.find("(fused)"), std::string::npos) << "the Relu after a conv is fused under tensorrt";
  EXPECT_NE(m.find("class n0 quantized"), std::string::npos);
  // Without a config: the float model, no quantizer lines.
  ASSERT_EQ(run_cli("inspect " + testing::fixture_model() + " --dot " + dot).exit_code, 0);
  EXPECT_EQ(testing::read_text(dot).find("minmax"), std::string::npos);
}

// A learning rate far too high: the loss runs away from where training started; the run stops
// with the epoch and the loss, and writes neither the model nor a checkpoint of the diverged weights.
TEST_F(Cli, QatThatDivergesStopsAndWritesNothing) {
  const std::string cfg = work_ / "qat.toml", ckpt = work_ / "qat.ckpt";
  testing::write_text(cfg,
                      "backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\nbits = 4\nquantizer = \"lsq\"\n"
                      "[a]\nqscheme = \"per-tensor-affine\"\nbits = 4\nquantizer = \"lsq\"\n"
                      "[calibration]\nbatch_size = 8\n[qat]\nbatch_size = 8\n");
  const auto r = run_cli("qat " + testing::fixture_model() + " -c " + cfg + " --calib " + calib_ + " --train " +
                         calib_ + " -o " + out_ + "/qat.onnx --checkpoint " + ckpt + " --epochs 2 --lr 1000");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("QAT diverged: epoch 1's mean loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lower [qat] lr (now 1000)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out_ + "/qat.onnx"));
  EXPECT_FALSE(fs::exists(ckpt));
}

TEST_F(Cli, QatTrainsResumesFromItsCheckpointAndExports) {
  const std::string cfg = work_ / "qat.toml", ckpt = work_ / "qat.ckpt";
  testing::write_text(cfg,
                      "backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\nbits = 4\nquantizer = \"lsq\"\n"
                      "[a]\nqscheme = \"per-tensor-affine\"\nbits = 4\nquantizer = \"lsq\"\n"
                      "[calibration]\nbatch_size = 8\n[qat]\nbatch_size = 8\nlr = 1e-4\n");
  const std::string cmd = "qat " + testing::fixture_model() + " -c " + cfg + " --calib " + calib_ + " --train " +
                          calib_ + " -o " + out_ + "/qat.onnx --checkpoint " + ckpt + " --report " + out_ + "/r.json";
  auto r = run_cli(cmd + " --epochs 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rep = nlohmann::json::parse(testing::read_text(out_ + "/r.json"));
  EXPECT_EQ(rep["qat"]["resumed_after_epoch"], 0);
  ASSERT_EQ(rep["qat"]["epochs"].size(), 1u);
  EXPECT_EQ(rep["qat"]["epochs"][0]["samples"], 17);
  EXPECT_TRUE(fs::exists(ckpt));
  // A second run with more epochs continues after the first.
  r = run_cli(cmd + " --epochs 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming"), std::string::npos) << r.output;
  rep = nlohmann::json::parse(testing::read_text(out_ + "/r.json"));
  EXPECT_EQ(rep["qat"]["resumed_after_epoch"], 1);
  ASSERT_EQ(rep["qat"]["epochs"].size(), 1u);
  EXPECT_EQ(rep["qat"]["epochs"][0]["epoch"], 2);
  Model m = load_onnx(out_ + "/qat.onnx");
  std::size_t dq = 0;
  for (const Node* n : m.graph.nodes()) dq += n->op_type == "DequantizeLinear";
  EXPECT_GE(dq, 14u);
  // Another learning rate is another run: its checkpoint is refused, and nothing is written.
  testing::remove_tree(out_);
  fs::create_directories(out_);
  expect_failure(run_cli(cmd + " --epochs 2 --lr 1e-3"), {"qat.ckpt", "another run", "--restart"});
  r = run_cli(cmd + " --epochs 1 --lr 1e-3 --restart");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  testing::remove_tree(out_);
  fs::create_directories(out_);
  expect_failure(run_cli(cmd + " --loss hinge"), {"--loss", "mse or kl"});
}

TEST_F(Cli, PruneWritesTheSmallerModelItsReportAndTheMaskedModel) {
  const std::string cmd = "prune " + testing::fixture_model() + " -c " +
                          testing::source_path("configs/prune_channels_50.toml") + " -o " + out_ + "/p.onnx --report " +
                          out_ + "/r.json --masked " + out_ + "/m.onnx";
  auto r = run_cli(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("channels removed"), std::string::npos) << r.output;
  auto rep = nlohmann::json::parse(testing::read_text(out_ + "/r.json"));
  EXPECT_EQ(rep["pattern"], "channel");
  EXPECT_LT(rep["after"]["parameters"].get<double>(), 0.3 * rep["before"]["parameters"].get<double>());
  EXPECT_LT(rep["after"]["macs"].get<double>(), 0.3 * rep["before"]["macs"].get<double>());
  EXPECT_EQ(rep["after"]["file_bytes"].get<std::int64_t>(), static_cast<std::int64_t>(fs::file_size(out_ + "/p.onnx")));
  EXPECT_EQ(rep["before"]["file_bytes"].get<std::int64_t>(),
            static_cast<std::int64_t>(fs::file_size(out_ + "/m.onnx")));
  EXPECT_FALSE(rep["layers"].empty());
  Model pruned = load_onnx(out_ + "/p.onnx"), masked = load_onnx(out_ + "/m.onnx");
  at::Tensor x = at::rand({4, 1, 28, 28});
  Executor a(pruned.graph, testing::shipped_registry()), b(masked.graph, testing::shipped_registry());
  EXPECT_TRUE(at::allclose(a.run({{"image", x}})[0], b.run({{"image", x}})[0], 1e-5, 1e-5));
  EXPECT_EQ(testing::count_files(out_), 3);
}

TEST_F(Cli, PruneThenQuantizeInOneRunAndFineTune) {
  const std::string cfg = work_ / "pq.toml";
  testing::write_text(cfg,
                      "backend = \"onnxruntime\"\n[sparse]\nsparser = \"n_m\"\n[w]\nbits = 8\n"
                      "[a]\nqscheme = \"per-tensor-affine\"\n[calibration]\nbatch_size = 8\n[qat]\nbatch_size = 8\n");
  const std::string cmd =
      "prune " + testing::fixture_model() + " -c " + cfg + " -o " + out_ + "/pq.onnx --report " + out_ + "/r.json";
  // Quantizing needs calibration data.
  expect_failure(run_cli(cmd), {"pq.toml", "--calib"});
  auto r = run_cli(cmd + " --calib " + calib_ + " --finetune 1 --train " + calib_);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rep = nlohmann::json::parse(testing::read_text(out_ + "/r.json"));
  EXPECT_EQ(rep["pattern"], "N:M");
  EXPECT_EQ(rep["finetune"]["quantization_aware"], true);
  EXPECT_EQ(rep["finetune"]["epochs"].size(), 1u);
  EXPECT_GT(rep["quantization"]["quantized_inputs"].size(), 5u);
  // The exported QDQ weights keep 2:4 sparsity after fine-tuning: the int8 weights of every
  // conv with a multiple of 4 input channels have at most 2 non-zeros in each group of 4.
  Model m = load_onnx(out_ + "/pq.onnx");
  int checked = 0;
  for (const Node* n : m.graph.nodes()) {
    if (n->op_type != "DequantizeLinear" || !m.graph.initializers.count(n->inputs[0])) continue;
    const at::Tensor q = m.graph.initializers.at(n->inputs[0]);
    if (q.dim() != 4 || q.size(1) % 4) continue;
    EXPECT_LE((q.movedim(1, -1).reshape({-1, 4}) != 0).sum(1).max().item<std::int64_t>(), 2) << n->name;
    ++checked;
  }
  EXPECT_GE(checked, 3);
  // quantize with a [sparse] table prunes first too.
  r = run_cli("quantize " + testing::fixture_model() + " -c " + cfg + " --calib " + calib_ + " -o " + out_ +
              "/q.onnx --report " + out_ + "/q.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(testing::read_text(out_ + "/q.json"))["pruning"]["pattern"], "N:M");
}

TEST_F(Cli, PruneErrorsLeaveNoFile) {
  expect_failure(run_cli("prune " + testing::fixture_model() + " -c " + config_ + " -o " + out_ + "/p.onnx"),
                 {"w8a8_tensorrt.toml", "no [sparse] table"});
  const std::string cfg = work_ / "bad.toml";
  testing::write_text(cfg, "[sparse]\nsparser = \"magnitude\"\n");
  expect_failure(run_cli("prune " + testing::fixture_model() + " -c " + cfg + " -o " + out_ + "/p.onnx --report " +
                         out_ + "/r.json"),
                 {"bad.toml", "sparse.sparser", "'magnitude'", "l1_unstructured"});
  expect_failure(run_cli("prune " + testing::fixture_model() + " -c " + testing::source_path("configs/prune_2_4.toml") +
                         " -o " + out_ + "/p.onnx --finetune 1"),
                 {"--finetune needs --train"});
}

// A model whose opset cannot be lifted (a Dropout-9 mask changes type at opset 10 and is read)
// is refused with one message naming the node and op, exit status 1, and no output file.
TEST_F(Cli, ModelThatCannotBeLiftedIsRefusedNamingNodeAndOp) {
  Graph g;
  g.opset_imports[""] = 9;
  g.inputs.push_back(ValueInfo{"x", 1, true, {Dim{-1, "batch"}, Dim{1, ""}, Dim{28, ""}, Dim{28, ""}}, ""});
  g.outputs.push_back(g.inputs[0]);
  g.outputs[0].name = "y";
  Node drop;
  drop.op_type = "Dropout";
  drop.name = "drop";
  drop.inputs = {"x"};
  drop.outputs = {"kept", "mask"};
  g.append(std::move(drop));
  Node mul;
  mul.op_type = "Mul";
  mul.name = "mul";
  mul.inputs = {"kept", "mask"};
  mul.outputs = {"y"};
  g.append(std::move(mul));
  save_onnx(g, ModelMeta{}, work_ / "old_dropout.onnx");
  auto r = run_cli(quantize(work_ / "old_dropout.onnx", calib_));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  expect_failure(r, {"old_dropout.onnx", "node 'drop' (Dropout)", "cannot be lifted from opset 9 to 13", "mask"});
}

}  // namespace
}  // namespace sparsebit
