// 8-bit Q/DQ agreement with ONNX Runtime: our quantize_to_int / fake_quantize against ORT's
// QuantizeLinear / DequantizeLinear kernels on the same data, bit for bit (float8 and float16:
// test_ort_float8.cpp).

#include "ort_support.h"

namespace sparsebit::ort_tests {
namespace {

// Q/DQ arithmetic against ONNX Runtime's kernels, bit for bit: 8-bit at opset 13 and 4-bit
// (int4 / uint4 zero points) at opset 21, per tensor and per channel, exact ties included.
void expect_qdq_matches_ort(int bits) {
  testing::TempDir dir;
  at::manual_seed(bits == 8 ? 7 : 8);
  const double tie = bits == 8 ? 0.015625 : 0.0625;  // a power of two keeps the ties exact
  at::Tensor x = qdq_input(bits == 8 ? 2.0 : 0.5, tie);
  const std::string prefix = bits == 8 ? "int8" : "int4";
  for (const Case& c :
       {Case{"symmetric", true, false}, Case{"affine", false, false}, Case{"per_channel", true, true}}) {
    QSpec spec;
    spec.bits = bits;
    spec.symmetric = c.symmetric;
    spec.per_channel = c.per_channel;
    spec.channel_axis = 1;
    QParams p;
    if (c.per_channel) {
      p.scale = at::rand({kChannels}) * (bits == 8 ? 0.03 : 0.2) + 0.005;
      p.scale[0] = tie;
      p.zero_point = at::zeros({kChannels}, at::TensorOptions().dtype(at::kInt));
    } else {
      p.scale = at::scalar_tensor(c.symmetric ? tie : (bits == 8 ? 0.0173 : 0.173), at::kFloat);
      p.zero_point = at::scalar_tensor(c.symmetric ? 0 : (bits == 8 ? 131 : 6), at::TensorOptions().dtype(at::kInt));
    }
    const std::string path = dir / (prefix + "_" + c.name + ".onnx");
    save_onnx(qdq_model(p, c, bits), ModelMeta{}, path);
    at::Tensor ort = run_in_ort(path, "x", x, "y", dir);
    at::Tensor ours = fake_quantize(x, p, spec);
    ASSERT_TRUE(ort.defined());
    EXPECT_TRUE(at::equal(ort, ours)) << prefix << " " << c.name << ": max diff "
                                      << (ort - ours).abs().max().item<float>();
    // Our executor runs the same model (4-bit zero points held widened, Graph::narrow_types).
    Model reloaded = load_onnx(path);
    Executor executor(reloaded.graph, testing::shipped_registry());
    EXPECT_TRUE(at::equal(executor.run({{"x", x}})[0], ours)) << prefix << " " << c.name;
  }
}

TEST(OnnxRuntime, EightBitQdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  expect_qdq_matches_ort(8);
}

TEST(OnnxRuntime, FourBitQdqMatchesOnnxRuntimeExactly) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  expect_qdq_matches_ort(4);
}

// An opset-9 model (old BatchNormalization, Clip attributes, 2-D Softmax) is lifted to opset 13,
// quantized with per-channel weights, exported, and ONNX Runtime runs it to our simulated outputs:
// its fused integer kernels with reduce-range weights (which cannot saturate on any x86
// processor, Note [u8s8 saturation]), and the Q/DQ nodes as written ('basic') for TensorRT's rules.
TEST(OnnxRuntime, OldOpsetModelIsLiftedQuantizedAndRunsInOnnxRuntime) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  fs::create_directories(dir.path() / "calib");
  at::manual_seed(11);
  for (int i = 0; i < 4; ++i) write_npy(at::rand({8, 3, 16, 16}), dir / ("calib/b" + std::to_string(i) + ".npy"));
  at::Tensor x = at::rand({32, 3, 16, 16});
  for (const char* cfg : {"w8a8_tensorrt.toml", "w8a8_onnxruntime_reduce_range.toml"}) {
    Model m = load_onnx(testing::source_path("tests/fixtures/opset9_cnn.onnx"));
    EXPECT_EQ(m.meta.source_opset, 9);
    QuantModel qm(std::move(m), Config::from_file(testing::source_path(std::string("configs/") + cfg)),
                  testing::shipped_registry());
    auto data = open_dataset((dir.path() / "calib").string(), qm.graph().inputs);
    qm.calibrate(*data);
    qm.export_onnx(dir / "q.onnx");
    EXPECT_EQ(load_onnx(dir / "q.onnx").graph.default_opset(), 13);
    qm.set_quant(true, true);
    at::Tensor simulated = qm.forward({x})[0];
    const bool ort_rules = std::string(cfg) != "w8a8_tensorrt.toml";
    at::Tensor ort = run_in_ort(dir / "q.onnx", "x", x, "probs", dir, ort_rules ? "all" : "basic");
    ASSERT_TRUE(ort.defined()) << cfg;
    // The onnxruntime backend simulates the int32 bias QLinearConv adds; the tensorrt backend's
    // float bias is computed in float by ORT's reference path.
    const double tolerance = ort_rules ? 1e-5 : 1e-3;
    EXPECT_TRUE(at::allclose(ort, simulated, 0, tolerance))
        << cfg << ": max diff " << (ort - simulated).abs().max().item<float>();
  }
}

// Below 8 bits (Note [Narrow export]): the exported graph clips the 8-bit integers to the
// narrower grid and records the widths in metadata.
TEST(OnnxRuntime, NarrowBitExportReproducesTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (auto [wbits, abits] : {std::pair{4, 6}, std::pair{3, 5}}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.w.bits = wbits;
    c.a.bits = abits;
    auto qm = calibrated_fixture(c, 128);
    const std::string what = "W" + std::to_string(wbits) + "A" + std::to_string(abits);
    Model exported = check_export(*qm, dir / (what + ".onnx"), dir, 1.0, what);
    auto bits = nlohmann::json::parse(exported.meta.metadata_props.at("sparsebit.bits"));
    EXPECT_EQ(bits.at("image"), abits);
    EXPECT_EQ(bits.at("fc2.weight"), wbits);
    int clips = 0, quantizes = 0;
    for (const Node* n : exported.graph.nodes()) {
      clips += n->op_type == "Clip" && n->inputs[0].find("_quantized") != std::string::npos;
      quantizes += n->op_type == "QuantizeLinear";
    }
    EXPECT_EQ(clips, quantizes) << what;  // every activation Q/DQ pair is clipped to the narrow grid
  }
}

// Note [4-bit export]: 4-bit weights become int4 initializers behind DequantizeLinear at opset
// 21, and ONNX Runtime loads and runs the model at every optimization level.
TEST(OnnxRuntime, FourBitWeightsExportAsInt4AtOpset21) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (int abits : {8, 4}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.w.bits = 4;
    c.a.bits = abits;
    auto qm = calibrated_fixture(c, 128);
    const std::string path = dir / ("w4a" + std::to_string(abits) + ".onnx");
    Model exported = check_export(*qm, path, dir, 2.0, "W4A" + std::to_string(abits));
    EXPECT_EQ(exported.graph.default_opset(), 21);
    int int4 = 0;
    for (const auto& [name, type] : exported.graph.narrow_types) int4 += type == 22;
    EXPECT_EQ(int4, 7 * 2);  // 7 weights: the packed values and their zero points
    EXPECT_TRUE(run_in_ort(path, "image", test_images(4), "logits", dir, "all").defined());
  }
}

// AdaRound's learnt rounding and QAT's trained weights and scales are what the exported model
// computes: our executor on the export equals the simulation, ONNX Runtime is within 2 steps.
TEST(OnnxRuntime, AdaRoundAndQatExportsReproduceTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  Config ada = Config::from_file(testing::source_path("configs/w4a8_adaround.toml"));
  ada.w.quantizer_options.set("iterations", std::int64_t{50});
  auto qm = calibrated_fixture(ada, 128);
  check_export(*qm, dir / "adaround.onnx", dir, 2.0, "W4A8 AdaRound");
  for (const char* cfg : {"configs/w4a4_lsq.toml", "configs/w4a4_lsq_plus.toml"}) {
    Config c = Config::from_file(testing::source_path(cfg));
    c.calibration.count = 128;
    c.qat.count = 128;
    QuantModel student(load_onnx(testing::fixture_model()), c, testing::shipped_registry());
    const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
    auto calib = open_dataset(images, student.graph().inputs);
    student.init_qat(*calib);
    Model float_model = load_onnx(testing::fixture_model());
    Executor teacher(float_model.graph, testing::shipped_registry());
    distill(student, teacher, [&] { return open_dataset(images, student.graph().inputs); }, {c.qat, "", ""});
    check_export(student, dir / "qat.onnx", dir, 2.0, cfg);
  }
}

// Per-group weights (Note [Per-group quantization]) export as blocked DequantizeLinear at opset 21.
TEST(OnnxRuntime, PerGroupWeightsExportAsBlockedDequantizeLinear) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (int bits : {8, 4}) {
    Config c =
        Config::from_string("backend = \"virtual\"\n[w]\nqscheme = \"per-group-symmetric\"\ngroup_size = 16\nbits = " +
                                std::to_string(bits) + "\n",
                            "group.toml");
    auto qm = calibrated_fixture(c, 64);
    // Float accumulation order differs between LibTorch and ONNX Runtime, which can flip an
    // intermediate rounding: allow two output steps (our executor must match exactly).
    Model exported = check_export(*qm, dir / "group.onnx", dir, 2.0, "per-group W" + std::to_string(bits));
    EXPECT_EQ(exported.graph.default_opset(), 21);
    const Node* fc1_dq = nullptr;
    for (const Node* n : exported.graph.nodes())
      if (n->op_type == "DequantizeLinear" && n->inputs[0].rfind("fc1.weight", 0) == 0) fc1_dq = n;
    ASSERT_TRUE(fc1_dq);
    EXPECT_EQ(fc1_dq->attr_int("block_size", 0), 16);
    EXPECT_EQ(exported.graph.initializers.at(fc1_dq->inputs[1]).sizes(),
              (std::vector<std::int64_t>{128, 36}));  // 576 / 16
  }
}

// 16-bit activations: int16 (symmetric) and uint16 (affine) Q/DQ at opset 21.
TEST(OnnxRuntime, SixteenBitActivationsExportAtOpset21) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (const char* scheme : {"per-tensor-symmetric", "per-tensor-affine"}) {
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    c.backend = "virtual";
    c.a.bits = 16;
    c.a.qscheme = scheme;
    auto qm = calibrated_fixture(c, 64);
    // 16 bits: ORT must agree to a small fraction of an 8-bit output step (float noise only).
    Model exported = check_export(*qm, dir / "a16.onnx", dir, 0.04, scheme);
    EXPECT_EQ(exported.graph.default_opset(), 21);
  }
}

// The accuracy target's remedies export as they simulate and run in ONNX Runtime: int16
// layers as int16 Q/DQ at opset 21 beside 8-bit ones, float layers with no Q/DQ at all, layers
// on another range as 8-bit Q/DQ.
TEST(OnnxRuntime, TargetFallbackLayersExportAndMatchTheSimulation) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  testing::TempDir dir;
  for (const char* precision : {"int16", "float", "range"}) {
    const bool range = std::string(precision) == "range";
    Config c = Config::from_file(testing::source_path("configs/w8a8_onnxruntime.toml"));
    // Calibrated on minmax ranges, which the range remedy's candidates improve on (on its auto
    // ranges, with the grids tied around its MaxPools, no layer of this fixture gains by one).
    if (range) c.a.observer = "minmax";
    auto qm = calibrated_fixture(c, 128);
    TargetData data;
    const auto& inputs = qm->graph().inputs;
    const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
    data.calibration = images;
    SampleWindow held(open_dataset(images, inputs), inputs, 2000, 8);
    Batcher one(held, inputs, 1, 0);
    while (auto b = one.next()) data.holdout.push_back(b->inputs);
    data.range_observer = testing::shipped_registry().observer("auto")->factory;
    TargetConfig t;
    t.parse_expression("sqnr>=200", "test");  // out of reach: the whole budget is used
    t.fallback = {precision};
    t.max_fallback_layers = 3;
    TargetReport r = meet_target(*qm, t, data);
    if (range)  // costs nothing: every layer that a range helps takes one
      ASSERT_FALSE(r.fallback_layers.empty());
    else ASSERT_EQ(r.fallback_layers.size(), 3u) << precision;
    EXPECT_EQ(r.precision, precision);
    if (range) EXPECT_GE(r.after, r.before);
    else EXPECT_GT(r.after, r.before) << precision;
    Model exported = check_export(*qm, dir / (std::string(precision) + ".onnx"), dir, 1.0, precision);
    std::set<std::string> moved;
    for (const auto& l : r.fallback_layers) moved.insert(l.node);
    int wide = 0, into_moved = 0;
    std::map<std::string, const Node*> producer;
    for (const Node* n : exported.graph.nodes())
      for (const auto& o : n->outputs) producer[o] = n;
    for (const Node* n : exported.graph.nodes()) {
      if (n->op_type == "QuantizeLinear")
        wide += exported.graph.initializers.at(n->inputs[2]).scalar_type() == at::kShort ||
                exported.graph.narrow_types.count(n->inputs[2]) != 0;
      if (!moved.count(n->name)) continue;
      for (const auto& in : n->inputs) {
        auto p = producer.find(in);
        into_moved += p != producer.end() && p->second->op_type == "DequantizeLinear";
      }
    }
    if (std::string(precision) == "int16") {
      EXPECT_EQ(exported.graph.default_opset(), 21);
      EXPECT_GE(wide, 3);
      EXPECT_GE(into_moved, 3);  // still quantized, on 16 bits
    } else if (range) {
      EXPECT_EQ(wide, 0);
      EXPECT_GE(into_moved, 1);  // still quantized, on 8 bits
    } else {
      EXPECT_EQ(wide, 0);
      EXPECT_EQ(into_moved, 0);  // no Q/DQ in front of a float layer
    }
  }
}

// A float model whose weights live in a side file goes through `sparsebit quantize
// --external-data`; the QDQ export keeps its weights outside too, loads back to the same
// tensors, and runs in ONNX Runtime with the same outputs as the in-file export.
TEST(OnnxRuntime, ExternalDataRoundTripsThroughQuantize) {
  testing::TempDir dir;
  Model m = load_onnx(testing::fixture_model());
  ExportOptions ext;
  ext.external_data = true;
  save_onnx(m.graph, m.meta, dir / "float.onnx", ext);
  ASSERT_TRUE(std::filesystem::exists(dir / "float.onnx.data"));
  EXPECT_LT(std::filesystem::file_size(dir / "float.onnx"), std::filesystem::file_size(dir / "float.onnx.data"));
  Model back = load_onnx(dir / "float.onnx");
  for (const auto& [name, t] : m.graph.initializers)
    EXPECT_TRUE(at::equal(back.graph.initializers.at(name), t)) << name;

  const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
  // Two runs compared bit for bit: the static placement (the latency search follows the timings).
  const std::string common = " -c " + testing::source_path("configs/w8a8_onnxruntime.toml") + " --calib " + images +
                             " --calib-count 64 --no-latency";
  auto r = testing::run_cli("quantize " + (dir / "float.onnx") + common + " -o " + (dir / "q_ext.onnx") +
                            " --external-data");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(dir / "q_ext.onnx.data"));
  r = testing::run_cli("quantize " + (dir / "float.onnx") + common + " -o " + (dir / "q_in.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "q_in.onnx.data")) << "small models stay in one file by default";

  const at::Tensor x = test_images(16);
  at::Tensor with_side_file = run_in_ort(dir / "q_ext.onnx", "image", x, "logits", dir);
  at::Tensor in_file = run_in_ort(dir / "q_in.onnx", "image", x, "logits", dir);
  ASSERT_TRUE(with_side_file.defined() && in_file.defined());
  EXPECT_TRUE(at::equal(with_side_file, in_file));
}

// Channel-pruned models (both Fashion-MNIST fixtures, 30% and 50%) run in ONNX Runtime and
// compute what the masked models compute; pruned then W8A8-quantized, ORT reproduces the
// simulation.
TEST(OnnxRuntime, PrunedModelsMatchTheMaskedModelsAndQuantize) {
  testing::TempDir dir;
  at::Tensor x = test_images(16);
  for (const char* name : {"fashion_mnist_cnn", "fashion_mnist_mobilenet"}) {
    Model model = load_onnx(testing::source_path(std::string("examples/fashion_mnist/") + name + ".onnx"));
    for (double ratio : {0.3, 0.5}) {
      Config c = Config::from_string("[sparse]\nsparser = \"l1_structured\"\nratio = " + std::to_string(ratio) + "\n",
                                     "p.toml");
      c.plugins.use_environment = false;
      PruneResult r = prune(model, c, testing::shipped_registry(), sample_inputs(model.graph));
      EXPECT_GT(r.channels_removed, 0);
      save_onnx(r.pruned.graph, r.pruned.meta, dir / "pruned.onnx");
      save_onnx(r.masked.graph, r.masked.meta, dir / "masked.onnx");
      at::Tensor p = run_in_ort(dir / "pruned.onnx", "image", x, "logits", dir);
      at::Tensor m = run_in_ort(dir / "masked.onnx", "image", x, "logits", dir);
      ASSERT_TRUE(p.defined() && m.defined());
      EXPECT_LE((p - m).abs().max().item<double>(), 1e-5 * m.abs().max().item<double>()) << name << " " << ratio;
    }
  }
  Config c = Config::from_file(testing::source_path("configs/prune_channels_30_w8a8_onnxruntime.toml"));
  c.plugins.use_environment = false;
  Model model = load_onnx(testing::fixture_model());
  PruneResult r = prune(model, c, testing::shipped_registry(), sample_inputs(model.graph));
  c.calibration.count = 256;
  QuantModel qm(std::move(r.pruned), c, testing::shipped_registry());
  auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz", qm.graph().inputs);
  qm.calibrate(*data);
  check_export(qm, dir / "pruned_qdq.onnx", dir, 2, "pruned W8A8");
}

}  // namespace
}  // namespace sparsebit::ort_tests
