// The library pipeline on the bundled Fashion-MNIST model: slots, calibration modes, release
// of cached values, export structure, autograd, and the errors users hit first (control flow:
// test_pipeline_control_flow.cpp).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "pipeline_support.h"
#include "test_support.h"

namespace sparsebit::pipeline_tests {
namespace {

TEST(Pipeline, SlotsFollowOpRolesAndFusedChains) {
  QuantModel qm(load_onnx(testing::fixture_model()), config_for("w8a8_tensorrt.toml"), testing::shipped_registry());
  int conv_w = 0, conv_a = 0, fused = 0;
  for (const auto& s : qm.slots()) {
    if (s.op_type == "Conv" && s.role == InputRole::kWeight) {
      ++conv_w;
      EXPECT_TRUE(s.spec.per_channel);
      EXPECT_EQ(s.spec.channel_axis, 0);
    }
    if (s.op_type == "Conv" && s.role == InputRole::kActivation) ++conv_a;
    if (s.op_type == "Relu") {
      // Every Relu here follows a Conv, Gemm or Add: its input quantizer is fused away.
      EXPECT_TRUE(s.fake_fused) << s.where();
      ++fused;
    }
    EXPECT_NE(s.role, InputRole::kBias) << "tensorrt keeps biases in float";
    if (s.op_type == "Gemm" && s.role == InputRole::kWeight) EXPECT_EQ(s.spec.channel_axis, 0);  // transB = 1
  }
  EXPECT_EQ(conv_w, 5);
  EXPECT_EQ(conv_a, 5);
  EXPECT_EQ(fused, 6);
}

TEST(Pipeline, TensorRTQuantizesTheSkipBranchOfResidualAdds) {
  QuantModel qm(load_onnx(testing::fixture_model()), config_for("w8a8_tensorrt.toml"), testing::shipped_registry());
  int active = 0, fused = 0;
  for (const auto& s : qm.slots()) {
    if (s.op_type != "Add") continue;
    if (s.fake_fused) {
      ++fused;
      EXPECT_EQ(s.input_index, 0u) << "input 0 comes from conv5 and is fused into it";
      continue;
    }
    ++active;
    EXPECT_EQ(s.input_index, 1u);
    EXPECT_EQ(s.tensor, "/MaxPool_1_output_0");
  }
  EXPECT_EQ(active, 1);
  EXPECT_EQ(fused, 1);
  // ONNX Runtime runs QLinearAdd: both inputs stay quantized.
  QuantModel ort(load_onnx(testing::fixture_model()), config_for("w8a8_onnxruntime.toml"), testing::shipped_registry());
  int ort_add = 0;
  for (const auto& s : ort.slots()) ort_add += s.op_type == "Add" && s.active();
  EXPECT_EQ(ort_add, 2);
}

// Float8 goes only where it is computed correctly and deployed (Note [Float8 elements]): backends
// without DeploysFloat8, observers and quantizers without HandlesFloat8Elements are refused by name.
TEST(Pipeline, Float8TablesAreRefusedByPluginsThatDoNotHandleThem) {
  auto error_of = [](const std::string& toml) -> std::string {
    try {
      QuantModel qm(load_onnx(testing::fixture_model()), Config::from_string(toml, "fp8.toml"),
                    testing::shipped_registry());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of("backend = \"tensorrt\"\n[w]\ntype = \"fp8_e4m3\"\n[a]\ntype = \"fp8_e4m3\"\n"), "");
  EXPECT_NE(error_of("backend = \"onnxruntime\"\n[w]\ntype = \"fp8_e4m3\"\n").find("deploys no float8"),
            std::string::npos);
  EXPECT_NE(error_of("[w]\ntype = \"fp8_e4m3\"\nquantizer = \"lsq\"\n").find("quantizer 'lsq'"), std::string::npos);
  EXPECT_NE(error_of("[a]\ntype = \"fp8_e5m2\"\nobserver = \"kl_histogram\"\n").find("observer 'kl_histogram'"),
            std::string::npos);
  EXPECT_NE(error_of("backend = \"tensorrt\"\n[a]\ntype = \"fp8_e4m3\"\nqscheme = \"per-channel-symmetric\"\n")
                .find("FP8 activations take one scale"),
            std::string::npos);
}

TEST(Pipeline, OnnxRuntimeBackendQuantizesBiasesAtActivationTimesWeightScale) {
  QuantModel qm = calibrated(config_for("w8a8_onnxruntime.toml"));
  int biases = 0;
  for (const auto& s : qm.slots()) {
    if (s.role != InputRole::kBias) continue;
    ++biases;
    const auto& a = qm.slots()[static_cast<std::size_t>(s.bias_activation)];
    const auto& w = qm.slots()[static_cast<std::size_t>(s.bias_weight)];
    at::Tensor expected = a.quantizer->qparams().scale * w.quantizer->qparams().scale;
    EXPECT_TRUE(at::allclose(s.bias_params.scale, expected)) << s.where();
    EXPECT_EQ(s.spec.bits, 32);
  }
  EXPECT_EQ(biases, 7);  // 5 Conv + 2 Gemm
}

TEST(Pipeline, StreamingAndLayerwiseCalibrationAgreeAndLayerwiseReleasesEarly) {
  // Without the range selection, which streaming calibration alone runs (Note [Choosing ranges
  // by the consuming layer]), both modes compute the observers' own ranges.
  Config sc = config_for("w8a8_tensorrt.toml", 96, "streaming");
  sc.calibration.range_samples = 0;
  QuantModel a = calibrated(sc);
  Config lc = config_for("w8a8_tensorrt.toml", 96, "layerwise");
  lc.calibration.batch_size = 16;
  QuantModel b(load_onnx(testing::fixture_model()), lc, testing::shipped_registry());
  auto data = open_dataset(kImages, b.graph().inputs);
  CalibrationStats stats = b.calibrate(*data);
  EXPECT_EQ(stats.samples, 96);
  EXPECT_EQ(stats.batches, 6);
  ASSERT_EQ(a.slots().size(), b.slots().size());
  // Same ranges up to float rounding: a convolution over 16 samples need not sum in the order it
  // does over 32 (the BLAS kernel is chosen per processor and shape), so no bit equality here.
  for (std::size_t i = 0; i < a.slots().size(); ++i) {
    if (!a.slots()[i].calibrated) continue;
    EXPECT_TRUE(at::allclose(a.slots()[i].quantizer->qparams().scale, b.slots()[i].quantizer->qparams().scale, 1e-5, 0))
        << a.slots()[i].where();
  }
  // Release by out-degree: at most the residual branch plus the current output are cached,
  // per batch (a graph of 19 nodes would cache 20 values per batch without release).
  EXPECT_LE(stats.peak_cached_tensors, 3u * 6u);
  EXPECT_GE(stats.peak_cached_tensors, 6u);
}

TEST(Pipeline, ExecutorFreesIntermediatesAfterTheirLastReader) {
  QuantModel qm(load_onnx(testing::fixture_model()), config_for("w8a8_tensorrt.toml"), testing::shipped_registry());
  qm.forward({test_batch(4)});
  EXPECT_LE(qm.executor().last_peak_live(), 3u);
}

TEST(Pipeline, ExportedQdqGraphRunsToTheSimulatedOutputs) {
  for (const char* cfg : {"w8a8_tensorrt.toml", "w8a8_onnxruntime.toml"}) {
    QuantModel qm = calibrated(config_for(cfg));
    Graph g = qm.export_graph();
    int q = 0, dq = 0;
    for (const Node* n : g.nodes()) {
      q += n->op_type == "QuantizeLinear";
      dq += n->op_type == "DequantizeLinear";
    }
    // One Q/DQ pair per distinct (tensor, parameters): readers of the same tensor with the
    // same scale share it (TensorRT's residual placement quantizes a tensor a Conv also reads).
    std::set<std::pair<std::string, float>> activations, constants;
    for (const auto& s : qm.slots()) {
      if (s.fake_fused) continue;
      const QParams p = s.role == InputRole::kBias ? s.bias_params : s.quantizer->qparams();
      auto key = std::make_pair(s.tensor, p.scale.sum().item<float>());
      (s.role == InputRole::kActivation ? activations : constants).insert(key);
    }
    EXPECT_EQ(static_cast<std::size_t>(dq), activations.size() + constants.size()) << cfg;
    EXPECT_EQ(static_cast<std::size_t>(q), activations.size()) << cfg;  // constants are stored as integers
    for (const auto& s : qm.slots()) {
      if (s.fake_fused) continue;
      const Node* consumer = g.find_node(s.node_name);
      ASSERT_TRUE(consumer);
      EXPECT_NE(consumer->inputs[s.input_index].find("_dequantized"), std::string::npos) << s.where();
    }
    // Our executor runs the exported QDQ graph to the same numbers as the simulation.
    Executor ex(g, testing::shipped_registry());
    at::Tensor x = test_batch(64);
    at::Tensor from_export = ex.run({{"image", x}})[0];
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0];
    EXPECT_TRUE(at::allclose(from_export, simulated, 1e-5, 1e-5))
        << cfg << ": max diff " << (from_export - simulated).abs().max().item<float>();
  }
}

TEST(Pipeline, GradientsFlowThroughTheSimulatedModel) {
  QuantModel qm = calibrated(config_for("w8a8_tensorrt.toml"));
  qm.set_quant(true, true);
  at::Tensor x = test_batch(8).set_requires_grad(true);
  qm.forward({x})[0].pow(2).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
}

TEST(Pipeline, OpWithoutQModuleNamesOpNodeAndThePluginsCommand) {
  Model m = load_onnx(std::string(ONNX_TESTDATA_DIR) + "/node/test_nllloss_NC/model.onnx");
  try {
    QuantModel qm(std::move(m), config_for("w8a8_tensorrt.toml"), testing::shipped_registry());
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("no QModule for op NegativeLogLikelihoodLoss"), std::string::npos) << msg;
    EXPECT_NE(msg.find("node '"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sparsebit plugins"), std::string::npos) << msg;
  }
}

TEST(Pipeline, BackendRulesAreCheckedWhenTheModelIsBuilt) {
  Config c = config_for("w8a8_tensorrt.toml");
  c.a.qscheme = "per-tensor-affine";
  try {
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[a] breaks the rules of backend 'tensorrt'"), std::string::npos) << e.what();
  }
  c = config_for("w8a8_tensorrt.toml");
  c.backend = "tpu9000";
  try {
    QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("installed: onnxruntime, tensorrt, virtual"), std::string::npos) << e.what();
  }
  c = config_for("w8a8_tensorrt.toml");
  c.w.observer_options.set("alpah", 0.1);
  EXPECT_THROW(QuantModel(load_onnx(testing::fixture_model()), c, testing::shipped_registry()), Error);
}

TEST(Pipeline, SpecificEntriesChooseTheSchemePerNodeFirstMatchWins) {
  Config c = config_for("w8a8_onnxruntime.toml");
  c.backend = "virtual";
  Config extra = Config::from_string(R"(
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
[[specific]]
nodes = "/fc2/*"
w = { bits = 4 }
a = { bits = 6 }
[[specific]]
nodes = "/fc*"
w = { bits = 5 }
)",
                                     "specific.toml");
  c.w = extra.w;
  c.a = extra.a;
  c.specific = extra.specific;
  QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  for (const auto& s : qm.slots()) {
    if (s.role == InputRole::kBias) continue;
    int want = 8;
    if (s.node_name == "/fc2/Gemm") want = s.role == InputRole::kWeight ? 4 : 6;
    else if (s.node_name == "/fc1/Gemm" && s.role == InputRole::kWeight) want = 5;
    EXPECT_EQ(s.spec.bits, want) << s.where();
  }
  // A specific entry that breaks the backend's rules is refused, naming the entry.
  Config trt = config_for("w8a8_tensorrt.toml");
  trt.specific = Config::from_string(R"([[specific]]
nodes = "/fc2/*"
a = { qscheme = "per-tensor-affine" }
)",
                                     "s.toml")
                     .specific;
  try {
    QuantModel bad(load_onnx(testing::fixture_model()), trt, testing::shipped_registry());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[[specific]] #1 a breaks the rules of backend 'tensorrt'"), std::string::npos)
        << e.what();
  }
}

TEST(Pipeline, PerNodeEnableAndBitWidthChanges) {
  Config c = config_for("w8a8_onnxruntime.toml");
  c.backend = "virtual";
  QuantModel qm = calibrated(c);
  auto count_dq = [&] {
    const Graph g = qm.export_graph();
    std::size_t n = 0;
    for (const Node* node : g.nodes()) n += node->op_type == "DequantizeLinear";
    return n;
  };
  const std::size_t dq_before = count_dq();
  EXPECT_EQ(qm.set_enabled("/conv1/*", false), 2u);  // its activation and weight
  const std::size_t dq_after = count_dq();
  EXPECT_EQ(dq_after, dq_before - 2);  // the virtual backend keeps biases in float
  {
    QuantModel ort = calibrated(config_for("w8a8_onnxruntime.toml"));
    const auto dq = [&] {
      const Graph g = ort.export_graph();
      std::size_t n = 0;
      for (const Node* node : g.nodes()) n += node->op_type == "DequantizeLinear";
      return n;
    };
    const std::size_t with = dq();
    ort.set_enabled("/conv1/*", false);
    EXPECT_EQ(dq(), with - 3);  // activation, weight, and the int32 bias derived from them
  }

  EXPECT_EQ(qm.set_bits("/fc2/*", 4, InputRole::kWeight), 1u);
  qm.set_quant(true, true);
  EXPECT_THROW(qm.forward({test_batch(2)}), Error);  // rebuilt: must be calibrated again
  auto data = open_dataset(kImages, qm.graph().inputs);
  qm.calibrate(*data);
  for (const auto& s : qm.slots()) {
    if (s.node_name == "/fc2/Gemm" && s.role == InputRole::kWeight) EXPECT_EQ(s.spec.bits, 4);
    if (s.node_name == "/conv1/Conv" && s.role != InputRole::kBias) EXPECT_FALSE(s.active());
  }
  EXPECT_EQ(qm.forward({test_batch(2)})[0].size(1), 10);
  Config trt = config_for("w8a8_tensorrt.toml");
  QuantModel t(load_onnx(testing::fixture_model()), trt, testing::shipped_registry());
  EXPECT_THROW(t.set_bits("/fc2/*", 4), Error);  // TensorRT runs 8 bits only
}

TEST(Pipeline, ConvTransposeWeightsArePerChannelAlongAxisOne) {
  // W is [C_in = 2, C_out = 3, 3, 3]: one scale per output channel, i.e. along axis 1.
  Model m;
  m.graph.opset_imports[""] = 13;
  m.graph.inputs.push_back({"x", 1, true, {{-1, "n"}, {2, ""}, {4, ""}, {4, ""}}, ""});
  m.graph.outputs.push_back({"y", 1, true, {{-1, "n"}, {3, ""}, {9, ""}, {9, ""}}, ""});
  at::manual_seed(2);
  at::Tensor w = at::randn({2, 3, 3, 3});
  w.select(1, 2).mul_(10);  // output channel 2 has a 10x larger range
  m.graph.initializers["w"] = w;
  Node n;
  n.name = "up";
  n.op_type = "ConvTranspose";
  n.inputs = {"x", "w"};
  n.outputs = {"y"};
  n.attributes["strides"] = Attribute::of_ints({2, 2});
  m.graph.append(n);
  testing::TempDir dir;
  write_npy(at::rand({4, 2, 4, 4}), dir / "x.npy");
  QuantModel qm(std::move(m), config_for("w8a8_tensorrt.toml"), testing::shipped_registry());
  auto data = open_dataset(dir / "x.npy", qm.graph().inputs);
  qm.calibrate(*data);
  const QuantSlot* ws = nullptr;
  for (const auto& s : qm.slots())
    if (s.role == InputRole::kWeight) ws = &s;
  ASSERT_TRUE(ws);
  EXPECT_EQ(ws->spec.channel_axis, 1);
  at::Tensor scale = ws->quantizer->qparams().scale;
  ASSERT_EQ(scale.numel(), 3);
  EXPECT_GT(scale[2].item<float>(), 5 * scale[0].item<float>());
  EXPECT_GT(scale[2].item<float>(), 5 * scale[1].item<float>());
}

TEST(Pipeline, RecurrentWeightsArePerGateRowAndDeploymentBackendsKeepTheLayerFloat) {
  // A bidirectional LSTM: W [2, 4 * 3, 5], R [2, 4 * 3, 3]; one scale per stacked gate row
  // (axis 1), shared by the two directions, from max |w| over them (simulated: the virtual
  // backend). Neither ONNX Runtime nor TensorRT has an integer recurrent kernel: their configs
  // leave the layer float.
  auto model = [] {
    Model m;
    m.graph.opset_imports[""] = 14;
    m.graph.inputs.push_back({"x", 1, true, {{-1, "t"}, {-1, "n"}, {5, ""}}, ""});
    m.graph.outputs.push_back({"y", 1, true, {{-1, "t"}, {2, ""}, {-1, "n"}, {3, ""}}, ""});
    at::manual_seed(3);
    at::Tensor w = at::randn({2, 12, 5});
    w.select(1, 7).mul_(20);  // one gate row of the second direction is 20x larger
    m.graph.initializers["w"] = w;
    m.graph.initializers["r"] = at::randn({2, 12, 3});
    Node n;
    n.name = "lstm";
    n.op_type = "LSTM";
    n.inputs = {"x", "w", "r"};
    n.outputs = {"y"};
    n.attributes["hidden_size"] = Attribute::of_int(3);
    n.attributes["direction"] = Attribute::of_string("bidirectional");
    m.graph.append(n);
    return m;
  };
  testing::TempDir dir;
  write_npy(at::randn({6, 4, 5}), dir / "x.npy");
  Config simulated = config_for("w8a8_onnxruntime.toml");
  simulated.backend = "virtual";
  QuantModel qm(model(), simulated, testing::shipped_registry());
  auto data = open_dataset(dir / "x.npy", qm.graph().inputs);
  qm.calibrate(*data);
  int weights = 0, activations = 0;
  for (const auto& s : qm.slots()) {
    if (!s.active()) continue;
    if (s.role == InputRole::kActivation) ++activations;
    if (s.role != InputRole::kWeight) continue;
    ++weights;
    EXPECT_EQ(s.spec.channel_axis, 1) << s.where();
    at::Tensor expected = qm.graph().initializers.at(s.tensor).abs().amax({0, 2}) / 127.5;  // 2 max|w| / 255
    EXPECT_TRUE(at::allclose(s.quantizer->qparams().scale.reshape({-1}), expected, 1e-6, 0)) << s.where();
  }
  EXPECT_EQ(weights, 2);
  EXPECT_EQ(activations, 1);
  for (const char* deployed : {"w8a8_tensorrt.toml", "w8a8_onnxruntime.toml"}) {
    QuantModel q(model(), config_for(deployed), testing::shipped_registry());
    for (const auto& s : q.slots()) EXPECT_FALSE(s.active()) << deployed << " " << s.where();
  }
}

// Note [Inputs and outputs without a shape] (opset_lift.cpp): a model whose input and output
// declare an element type alone is written with their rank (as one sample has it) and unknown
// dims, which ONNX's checker accepts; without data to take the rank from, it is refused at load
// naming the tensor, before any work.
TEST(Pipeline, InputsAndOutputsWithoutAShapeAreWrittenWithTheirRank) {
  using testing::make_node;
  testing::TempDir dir;
  Model m;
  m.graph.opset_imports[""] = 13;
  m.graph.inputs.push_back({"x", 1, false, {}, ""});
  m.graph.outputs.push_back({"y", 1, false, {}, ""});
  at::manual_seed(9);
  m.graph.initializers["w"] = at::randn({8, 4});
  m.graph.append(make_node("mm", "MatMul", {"x", "w"}, {"h"}));
  m.graph.append(make_node("act", "Relu", {"h"}, {"y"}));
  ExportOptions unchecked;
  unchecked.run_checker = false;  // ONNX's checker refuses the model as written, as ONNX Runtime does not
  save_onnx(m.graph, m.meta, dir / "m.onnx", unchecked);
  write_npy(at::randn({16, 8}), dir / "x.npy");

  QuantizeJob job;
  job.model = dir / "m.onnx";
  job.calib = dir / "x.npy";
  job.config = config_for("w8a8_onnxruntime.toml", 16, "streaming");
  job.output = dir / "q.onnx";
  run_quantize(job, nullptr);  // the export runs ONNX's checker
  const Model q = load_onnx(dir / "q.onnx");
  for (const ValueInfo* v : {&q.graph.inputs.at(0), &q.graph.outputs.at(0)}) {
    EXPECT_TRUE(v->has_shape) << v->name;
    ASSERT_EQ(v->shape.size(), 2u) << v->name;
    for (const Dim& d : v->shape) EXPECT_TRUE(d.value < 0 && d.param.empty()) << v->name << ": dims stay unknown";
  }

  const std::string e = testing::error_of([&] { load_and_lift(dir / "m.onnx", testing::shipped_registry(), ""); });
  for (const char* needle : {"m.onnx", "input 'x'", "no shape", "calibration data"})
    EXPECT_NE(e.find(needle), std::string::npos) << needle << " missing in: " << e;
}

// Note [Data sources]: samples an application holds in memory go through every step that reads
// data (calibration, the agreement check, evaluation) as the same samples in a file do.
TEST(Pipeline, AJobReadsSamplesInMemoryAsItReadsTheirFile) {
  struct InMemory final : Dataset {
    at::Tensor images;  // [n, 1, 28, 28], handed out 16 at a time
    std::int64_t at = 0;
    explicit InMemory(at::Tensor x) : images(std::move(x)) {}
    std::string describe() const override { return "frames in memory"; }
    std::optional<std::int64_t> num_samples() const override { return images.size(0); }
    std::optional<Batch> next() override {
      if (at >= images.size(0)) return std::nullopt;
      const std::int64_t n = std::min<std::int64_t>(16, images.size(0) - at);
      Batch b{{images.narrow(0, at, n)}, "frames", true};
      at += n;
      return b;
    }
  };
  const at::Tensor calib = read_idx(kImages, 96).to(at::kFloat).div(255).unsqueeze(1);
  const at::Tensor eval = test_batch(64);
  int opened = 0;
  auto in_memory = [&](const std::string& name, at::Tensor x) {
    return DataSource(name, [&opened, x](const std::vector<ValueInfo>&) {
      ++opened;
      return std::make_unique<InMemory>(x);
    });
  };
  testing::TempDir dir;
  auto run = [&](DataSource calib_source, DataSource eval_source, const std::string& output) {
    QuantizeJob job;
    job.model = testing::fixture_model();
    job.calib = std::move(calib_source);
    job.config = config_for("w8a8_onnxruntime.toml", 64, "layerwise");
    job.output = dir / output;
    job.evaluation = EvaluationRequest{std::move(eval_source), "", "", ""};
    return run_quantize(job, nullptr);
  };
  write_npy(eval, dir / "eval.npy");
  const QuantizeOutcome files = run(kImages, dir / "eval.npy", "files.onnx");
  const QuantizeOutcome memory = run(in_memory("calib", calib), in_memory("eval", eval), "memory.onnx");
  EXPECT_GE(opened, 3) << "calibration, the agreement check and evaluation each open the source";
  EXPECT_EQ(memory.calibration.samples, 64);
  ASSERT_TRUE(memory.evaluation && files.evaluation);
  EXPECT_EQ(memory.evaluation->samples, 64);
  EXPECT_EQ(files.evaluation->samples, 64);
  EXPECT_EQ(memory.evaluation->top1_agreement, files.evaluation->top1_agreement);
  EXPECT_EQ(memory.evaluation->max_abs_output_diff, files.evaluation->max_abs_output_diff);
  EXPECT_EQ(testing::read_text(dir / "memory.onnx"), testing::read_text(dir / "files.onnx"));
}

TEST(Pipeline, SkipGlobsKeepNodesInFloat) {
  Config c = config_for("w8a8_tensorrt.toml");
  c.skip = {"/fc*"};
  QuantModel qm(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
  for (const auto& s : qm.slots()) EXPECT_EQ(s.node_name.rfind("/fc", 0), std::string::npos) << s.where();
}

}  // namespace
}  // namespace sparsebit::pipeline_tests
