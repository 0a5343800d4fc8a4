// Adversarial numbers and types: NaN outputs, sequence outputs, float16 and float64 models, and
// sizes past the memory limit, each refused or handled by name (the fixture: hardening_fixture.h).

#include "hardening_fixture.h"

namespace sparsebit::hardening {
namespace {

// A float model whose output is NaN on the calibration data: the bit allocation, which judges
// widths by the output error they add, refuses it by name (it used to index an empty choice and
// crash); the agreement check counts NaN instead of zeroing it into "cosine 1.0000" and says
// when nothing is left to compare.
TEST_F(Hardening, NanOutputsAreNeverJudgedAsAgreement) {
  auto model = [&](const std::string& name, bool all_nan) {
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
    g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}};
    g.initializers["w"] = at::randn({8, 16});
    g.initializers["one"] = at::ones({});
    using testing::make_node;
    g.append(make_node("fc", "Gemm", {"x", "w"}, {"h"}, {{"transB", Attribute::of_int(1)}}));
    if (all_nan) {  // sqrt(-(|h| + 1)) everywhere
      g.append(make_node("abs", "Abs", {"h"}, {"a"}));
      g.append(make_node("add", "Add", {"a", "one"}, {"a1"}));
      g.append(make_node("neg", "Neg", {"a1"}, {"n"}));
      g.append(make_node("sqrt", "Sqrt", {"n"}, {"y"}));
    } else {  // sqrt of a Gemm's output: NaN wherever it is negative
      g.append(make_node("sqrt", "Sqrt", {"h"}, {"y"}));
    }
    const std::string path = (work_.path() / name).string();
    save_onnx(g, ModelMeta{}, path);
    return path;
  };
  const fs::path data = samples(at::kFloat);
  testing::write_text(config_, "backend = \"virtual\"\n[bit_allocation]\navg_weight_bits = 6\n");
  const std::string some_nan = model("some_nan.onnx", false), all_nan = model("all_nan.onnx", true);
  expect_one_line_error(run_cli("quantize " + some_nan + " -c " + config_ + " --calib " + data.string() + " -o " +
                                (work_.path() / "a.onnx").string()),
                        {"[bit_allocation]", "output 'y'", "NaN or infinite"});
  EXPECT_FALSE(fs::exists(work_.path() / "a.onnx"));

  fs::copy_file(testing::source_path("configs/w8a8_tensorrt.toml"), config_, fs::copy_options::overwrite_existing);
  const fs::path report = work_.path() / "r.json";
  auto r = run_cli("quantize " + all_nan + " -c " + config_ + " --calib " + data.string() + " -o " +
                   (work_.path() / "b.onnx").string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("cosine 1.0000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no agreement can be measured"), std::string::npos) << r.output;
  const auto a = nlohmann::json::parse(testing::read_text(report.string())).at("agreement");
  EXPECT_TRUE(a.at("poor").get<bool>());
  EXPECT_TRUE(a.at("outputs")[0].at("cosine").is_null());
  EXPECT_EQ(a.at("outputs")[0].at("not_finite_float").get<std::int64_t>(), 4 * 8);

  r = run_cli("quantize " + some_nan + " -c " + config_ + " --calib " + data.string() + " -o " +
              (work_.path() / "c.onnx").string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto b = nlohmann::json::parse(testing::read_text(report.string())).at("agreement").at("outputs")[0];
  const std::int64_t nan_float = b.at("not_finite_float").get<std::int64_t>();
  EXPECT_GT(nan_float, 0);
  EXPECT_LT(nan_float, 4 * 8);
  EXPECT_NE(r.output.find("NaN or infinite at " + std::to_string(nan_float) + " of its 32 values"), std::string::npos)
      << r.output;
}

// A model with a sequence output: calibration's output judgment (Note [Choices judged at the
// output]) and [bit_allocation] compare tensors only; a sequence is left out of the comparison
// instead of reaching LibTorch's "NestedTensorImpl doesn't support sizes".
TEST_F(Hardening, SequenceOutputsAreLeftOutOfEveryJudgment) {
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}, {"s", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.initializers["w"] = at::randn({8, 16});
  g.initializers["w2"] = at::randn({8, 8});
  g.append(testing::make_node("fc", "Gemm", {"x", "w"}, {"h"}, {{"transB", Attribute::of_int(1)}}));
  g.append(testing::make_node("relu", "Relu", {"h"}, {"r"}));
  g.append(testing::make_node("fc2", "Gemm", {"r", "w2"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  g.append(testing::make_node("seq", "SequenceConstruct", {"y", "h"}, {"s"}));
  const std::string path = (work_.path() / "seq.onnx").string();
  save_onnx(g, ModelMeta{}, path);
  onnx::ModelProto m;
  {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(m.ParseFromIstream(&in));
  }
  auto* type = m.mutable_graph()->mutable_output(1)->mutable_type();
  type->Clear();
  type->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << m.SerializeAsString();

  const fs::path data = work_.path() / "many";  // more than range_samples: held-out samples judge
  fs::create_directories(data);
  at::manual_seed(3);  // heavy tails: the layers choose ranges of their own
  for (int i = 0; i < 24; ++i) write_npy(at::randn({16}).pow(3), (data / ("s" + std::to_string(i) + ".npy")).string());
  const std::string out = (work_.path() / "q.onnx").string();
  auto r = run_cli("quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ranges chosen by their layer's error"), std::string::npos) << r.output;
  testing::write_text(config_, "backend = \"virtual\"\n[bit_allocation]\navg_weight_bits = 6\n");
  r = run_cli("quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Note [Half-precision models]: a float16 model is quantized (computed in float32 inside, where
// the Q/DQ pairs are) and its export still takes and gives float16 (it used to stop at
// "aminmax_cpu not implemented for 'Half'"). The reference is the same model and data widened
// to float32 and quantized the same way: ONNX Runtime runs both exports on one input, and the
// float16 export's outputs are the float32 export's rounded to float16.
TEST_F(Hardening, Float16ModelsAreQuantizedAndKeepTheirInputAndOutputTypes) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  at::manual_seed(7);
  const std::string half = two_gemms("half.onnx", "fc1", at::kHalf);
  const fs::path half_data = samples(at::kHalf), float_data = work_.path() / "data32";
  fs::create_directories(float_data);
  for (const auto& e : fs::directory_iterator(half_data))
    write_npy(read_npy(e.path().string()).to(at::kFloat), (float_data / e.path().filename()).string());
  Model widened = load_onnx(half);
  for (auto& kv : widened.graph.initializers) kv.second = kv.second.to(at::kFloat);
  widened.graph.inputs[0].elem_type = widened.graph.outputs[0].elem_type = 1;
  const std::string wide = (work_.path() / "float.onnx").string();
  save_onnx(widened.graph, ModelMeta{}, wide);

  const at::Tensor x = at::randn({32, 16}).to(at::kHalf);
  write_npy(x, (work_.path() / "x16.npy").string());
  write_npy(x.to(at::kFloat), (work_.path() / "x32.npy").string());
  auto ort = [&](const std::string& path, const std::string& in) {
    const std::string out = (work_.path() / "y.npy").string();
    const auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " +
                                        path + " --in x=" + (work_.path() / in).string() + " --out y=" + out);
    EXPECT_EQ(r.exit_code, 0) << path << "\n" << r.output;
    return r.exit_code == 0 ? read_npy(out) : at::Tensor();
  };
  for (const char* config : {"configs/w8a8_onnxruntime.toml", "configs/w8a8_tensorrt.toml"}) {
    SCOPED_TRACE(config);
    fs::copy_file(testing::source_path(config), config_, fs::copy_options::overwrite_existing);
    const std::string q16 = (work_.path() / "q16.onnx").string(), q32 = (work_.path() / "q32.onnx").string();
    auto r = run_cli("quantize " + half + " -c " + config_ + " --calib " + half_data.string() + " -o " + q16);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_cli("quantize " + wide + " -c " + config_ + " --calib " + float_data.string() + " -o " + q32);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    onnx::ModelProto exported;
    std::ifstream in(q16, std::ios::binary);
    ASSERT_TRUE(exported.ParseFromIstream(&in));
    EXPECT_EQ(exported.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
    EXPECT_EQ(exported.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
    int quantize_linear = 0;
    for (const auto& n : exported.graph().node()) quantize_linear += n.op_type() == "QuantizeLinear";
    EXPECT_GE(quantize_linear, 2);  // both layers' inputs
    const at::Tensor y16 = ort(q16, "x16.npy");
    const at::Tensor y32 = ort(q32, "x32.npy");
    ASSERT_TRUE(y16.defined() && y32.defined());
    ASSERT_EQ(y16.scalar_type(), at::kHalf);
    // Rounding to float16 moves a value by at most half a unit in its last place (2^-11 relative).
    const at::Tensor bound = y32.abs() * std::ldexp(1.0, -11) + 1e-7;
    EXPECT_TRUE(((y16.to(at::kFloat) - y32).abs() <= bound).all().item<bool>())
        << (y16.to(at::kFloat) - y32).abs().max().item<float>();
  }
}

// A float64 model: ONNX's QuantizeLinear and DequantizeLinear take no float64, so its Q/DQ export
// would be a file no runtime loads (it used to be written, exit 0). Refused naming the node and
// the tensor, with the way out, and nothing written; with every config the same.
TEST_F(Hardening, Float64ModelsAreRefusedAtExportNotWrittenInvalid) {
  const std::string model = two_gemms("double.onnx", "fc1", at::kDouble);
  const fs::path data = samples(at::kDouble);
  for (const char* config : {"configs/w8a8_onnxruntime.toml", "configs/w8a8_tensorrt.toml"}) {
    fs::copy_file(testing::source_path(config), config_, fs::copy_options::overwrite_existing);
    const fs::path out = work_.path() / "q.onnx";
    expect_one_line_error(
        run_cli("quantize " + model + " -c " + config_ + " --calib " + data.string() + " -o " + out.string()),
        {"of node 'fc", "float64", "convert the model to float32"});
    EXPECT_FALSE(fs::exists(out)) << config;
  }
}

// Sizes a model computes at run time (Note [Memory limit]): each op below asks for about 10^12
// elements from a tiny file, more than any machine's memory. Every one is refused before it is
// allocated, naming the node and the limit's flag (they used to allocate until the machine ran
// out, or stop at a bare std::bad_alloc). A modest size passes the default limit and is refused
// under a lower --memory-limit, so the check is the limit and not a size rule.
TEST_F(Hardening, SizesComputedAtRunTimeAreCheckedAgainstTheMemoryLimitBeforeAllocation) {
  using testing::make_node;
  const std::int64_t M = 1000000;
  auto i64 = [](std::vector<std::int64_t> v) { return at::tensor(v, at::kLong); };
  struct Case {
    std::string op;
    std::int64_t opset;
    std::function<void(Graph&)> build;  // from h4 [N, 8, 1, 1] (or anything) to `big`
  };
  const std::vector<Case> cases = {
      {"ConstantOfShape", 13,
       [&](Graph& g) {
         g.initializers["shape"] = i64({M, M});
         g.append(make_node("huge", "ConstantOfShape", {"shape"}, {"big"}));
       }},
      {"Expand", 13,
       [&](Graph& g) {
         g.initializers["shape"] = i64({M, M, 1, 8, 1, 1});
         g.append(make_node("huge", "Expand", {"h4", "shape"}, {"e"}));
         g.append(make_node("after", "Relu", {"e"}, {"big"}));
       }},
      {"Tile", 13,
       [&](Graph& g) {
         g.initializers["repeats"] = i64({1, 1, M, M});
         g.append(make_node("huge", "Tile", {"h4", "repeats"}, {"big"}));
       }},
      {"Pad", 13,
       [&](Graph& g) {
         g.initializers["pads"] = i64({0, 0, M, M, 0, 0, M, M});
         g.append(make_node("huge", "Pad", {"h4", "pads"}, {"big"}));
       }},
      {"Resize", 13,
       [&](Graph& g) {
         g.initializers["scales"] = at::tensor({1.0f, 1.0f, 1e6f, 1e6f});
         g.append(make_node("huge", "Resize", {"h4", "", "scales"}, {"big"}));
       }},
      {"Upsample", 9,
       [&](Graph& g) {
         g.initializers["scales"] = at::tensor({1.0f, 1.0f, 1e6f, 1e6f});
         g.append(make_node("huge", "Upsample", {"h4", "scales"}, {"big"}));
       }},
      {"OneHot", 13,
       [&](Graph& g) {
         g.initializers["indices"] = i64({0, 1});
         g.initializers["depth"] = i64({M * M});
         g.initializers["values"] = at::tensor({0.0f, 1.0f});
         g.append(make_node("huge", "OneHot", {"indices", "depth", "values"}, {"big"}));
       }},
      {"ConvTranspose", 13,
       [&](Graph& g) {
         g.initializers["wt"] = at::randn({8, 1, 2, 2});
         g.append(
             make_node("huge", "ConvTranspose", {"h4", "wt"}, {"big"}, {{"dilations", Attribute::of_ints({M, M})}}));
       }},
      {"Conv", 13,
       [&](Graph& g) {
         g.initializers["wc"] = at::randn({1, 8, 1, 1});
         g.append(make_node("huge", "Conv", {"h4", "wc"}, {"big"}, {{"pads", Attribute::of_ints({M, M, M, M})}}));
       }},
  };
  const fs::path data = samples(at::kFloat);
  fs::copy_file(testing::source_path("configs/w8a8_onnxruntime.toml"), config_, fs::copy_options::overwrite_existing);
  auto model = [&](const Case& c) {
    Graph g;
    g.opset_imports[""] = c.opset;
    g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
    const bool two_dims = c.op == "ConstantOfShape" || c.op == "OneHot";
    const std::vector<Dim> big(two_dims ? 2 : c.op == "Expand" ? 6 : 4, Dim{-1, ""});
    g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}, {"big", 1, true, big, ""}};
    g.initializers["w"] = at::randn({8, 16});
    g.initializers["b"] = at::zeros({8});
    g.initializers["to4"] = i64({-1, 8, 1, 1});
    g.append(make_node("fc", "Gemm", {"x", "w", "b"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
    g.append(make_node("to4", "Reshape", {"y", "to4"}, {"h4"}));
    c.build(g);
    const std::string path = (work_.path() / (c.op + ".onnx")).string();
    save_onnx(g, ModelMeta{}, path);
    return path;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const fs::path out = work_.path() / "q.onnx";
    const auto r =
        run_cli("quantize " + model(c) + " -c " + config_ + " --calib " + data.string() + " -o " + out.string());
    expect_one_line_error(r, {"node 'huge'", c.op, "memory limit", "--memory-limit", "GiB"});
    EXPECT_FALSE(fs::exists(out));
  }

  // 4096 x 4096 floats: 64 MiB, within any test machine's default limit, not within 16 MiB.
  const Case modest{"ConstantOfShape", 13, [&](Graph& g) {
                      g.initializers["shape"] = i64({4096, 4096});
                      g.append(make_node("huge", "ConstantOfShape", {"shape"}, {"big"}));
                    }};
  const std::string path = model(modest);
  const fs::path out = work_.path() / "q.onnx";
  auto r = run_cli("--memory-limit 16MiB quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " +
                   out.string());
  expect_one_line_error(r, {"node 'huge'", "64.0 MiB", "memory limit of 16.0 MiB", "--memory-limit"});
  EXPECT_FALSE(fs::exists(out));
  r = run_cli("quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out));

  expect_one_line_error(run_cli("--memory-limit 12parsecs quantize " + path + " -c " + config_ + " --calib " +
                                data.string() + " -o " + out.string()),
                        {"--memory-limit", "'12parsecs' is not a memory size"});
}

}  // namespace
}  // namespace sparsebit::hardening
