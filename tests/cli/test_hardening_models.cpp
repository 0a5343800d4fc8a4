// Adversarial input files and models: readers that check sizes before allocating, models that
// contradict themselves, outputs that are not what they say (the command line itself:
// test_hardening.cpp; numbers and types: test_hardening_numbers.cpp).

#include "hardening_fixture.h"

namespace sparsebit::hardening {
namespace {

void write_npy_header(const fs::path& path, const std::string& dict, char version = 1, std::size_t data_bytes = 0) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string bytes("\x93NUMPY", 6);
  bytes += version;
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  if (version > 1) bytes += std::string(2, '\0');
  bytes += header + std::string(data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST_F(Hardening, NpyHeadersAreParsedStrictly) {
  const fs::path p = work_.path() / "x.npy";
  for (const auto& [dict, version, needle] : std::vector<std::tuple<std::string, char, std::string>>{
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4, -1, 28, 28), }", 1, "'-4'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4.0, 1, 28, 28), }", 1, "'4.0'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,, 28), }", 1, "not a non-negative integer"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 28, 28), }", 9, "version 9"},
           // What numpy's own reader refuses: a key twice, a fortran_order that is not a bool,
           // another key, a missing one, text after the dict.
           {"{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (4, 1, 28, 28), }", 1, "'descr' twice"},
           {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4, 1, 28, 28), }", 1, "neither True nor False"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 28, 28), 'x': 1}", 1, "the key 'x'"},
           {"{'descr': '<f4', 'shape': (4, 1, 28, 28), }", 1, "no 'fortran_order'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 28, 28), } junk", 1, "more after its dict"}}) {
    write_npy_header(p, dict, version, 4 * 4 * 28 * 28);
    const std::string why = testing::error_of([&] { read_npy(p.string()); });
    EXPECT_NE(why.find("x.npy"), std::string::npos) << why;
    EXPECT_NE(why.find(needle), std::string::npos) << why;
  }
  write_npy_header(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 28, 28), }", 3, 4 * 2 * 28 * 28);
  EXPECT_EQ(read_npy(p.string()).sizes(), (std::vector<std::int64_t>{2, 1, 28, 28}));
  // A 0-d array for calibration: the file is named and the fix given.
  const fs::path dir = work_.path() / "scalar";
  fs::create_directories(dir);
  write_npy(at::scalar_tensor(1.0f), (dir / "s.npy").string());
  auto r = run_cli("quantize " + model_ + " -c " + config_ + " --calib " + dir.string() + " -o " +
                   (work_.path() / "q.onnx").string());
  expect_one_line_error(r, {"s.npy", "0-d array"});
}

TEST_F(Hardening, IdxSizesAreCheckedAgainstTheFileBeforeAllocating) {
  auto idx = [&](const std::string& name, std::vector<std::uint32_t> dims, std::size_t data) {
    std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
    for (auto d : dims)
      for (int s = 24; s >= 0; s -= 8) bytes += static_cast<char>((d >> s) & 0xff);
    bytes += std::string(data, '\0');
    const fs::path p = work_.path() / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  };
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  auto calib = [&](const std::string& path) {
    return "quantize " + model_ + " -c " + config_ + " --calib " + path + q;
  };
  expect_one_line_error(run_cli(calib(idx("short.idx", {60000, 28, 28}, 100))), {"short.idx", "declares"});
  expect_one_line_error(run_cli(calib(idx("huge.idx", {0xffffffffu, 0xffffffffu, 0xffffffffu}, 16))), {"huge.idx"});
  const auto r = run_cli(calib(idx("huge2.idx", {0xffffffffu, 0xffffffffu, 0xffffffffu}, 16)));
  EXPECT_EQ(r.output.find("c10"), std::string::npos) << r.output;
}

onnx::ModelProto fixture_proto() {
  onnx::ModelProto m;
  std::ifstream in(testing::fixture_model(), std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in));
  return m;
}

TEST_F(Hardening, ModelsNewerThanTheExecutorOrInconsistentAreRefusedAtLoad) {
  auto refused = [&](onnx::ModelProto m) {
    const std::string path = (work_.path() / "bad.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    // The shipped plugins check their ops' nodes (a Conv's attributes against its weight).
    return testing::error_of([&] { load_onnx(path, ImportOptions{0, &testing::shipped_registry()}); });
  };
  onnx::ModelProto m = fixture_proto();
  m.mutable_opset_import(0)->set_version(99);
  EXPECT_NE(refused(m).find("opset 99 is newer"), std::string::npos) << refused(m);
  m = fixture_proto();
  m.set_ir_version(99);
  EXPECT_NE(refused(m).find("IR version 99"), std::string::npos) << refused(m);
  m = fixture_proto();
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    if (n.op_type() != "Conv") continue;
    onnx::AttributeProto* a = nullptr;
    for (auto& existing : *n.mutable_attribute())
      if (existing.name() == "kernel_shape") a = &existing;
    if (!a) a = n.add_attribute();
    a->set_name("kernel_shape");
    a->set_type(onnx::AttributeProto::INTS);
    a->clear_ints();
    a->add_ints(7);
    a->add_ints(7);
    break;
  }
  std::string why = refused(m);
  EXPECT_NE(why.find("kernel_shape [7, 7] disagrees"), std::string::npos) << why;
  EXPECT_NE(why.find("(Conv)"), std::string::npos) << why;
  m = fixture_proto();
  m.mutable_graph()->mutable_output(0)->clear_type();
  why = refused(m);
  EXPECT_NE(why.find("graph output '"), std::string::npos) << why;
}

// Note [Declarations checked at import]: impossible dimensions and declarations that contradict
// each other are refused with the value named; -1, older exporters' open dimension, is read.
TEST_F(Hardening, DeclarationsThatContradictThemselvesAreRefusedAtLoad) {
  auto load = [&](const onnx::ModelProto& m) {
    const std::string path = (work_.path() / "declared.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    return testing::error_of([&] { load_onnx(path, ImportOptions{0, &testing::shipped_registry()}); });
  };
  onnx::ModelProto m = fixture_proto();
  const std::string input = m.graph().input(0).name();
  auto* dim =
      m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(2);
  dim->set_dim_value(-5);
  std::string why = load(m);
  EXPECT_NE(why.find("graph input '" + input + "' declares dimension 2 as -5"), std::string::npos) << why;
  dim->set_dim_value(-1);  // read as open: loads
  const std::string path = (work_.path() / "open.onnx").string();
  std::ofstream(path, std::ios::binary) << m.SerializeAsString();
  EXPECT_NO_THROW(load_onnx(path, ImportOptions{0, &testing::shipped_registry()}));
  m = fixture_proto();
  auto* info = m.mutable_graph()->add_value_info();
  *info = m.graph().output(0);
  info->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  why = load(m);
  EXPECT_NE(why.find("value_info '" + m.graph().output(0).name() + "' contradicts its declaration as graph output"),
            std::string::npos)
      << why;
  // A fixed batch of 0 takes no sample: refused before calibrating, not fed batches of 1 to 4.
  m = fixture_proto();
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(0);
  const std::string zero = (work_.path() / "zero_batch.onnx").string();
  std::ofstream(zero, std::ios::binary) << m.SerializeAsString();
  expect_one_line_error(run_cli("quantize " + zero + " -c " + config_ + " --calib " + kImages + " --calib-count 8 -o " +
                                (work_.path() / "q.onnx").string()),
                        {"declares a batch dimension of 0"});
}

// Note [Declared outputs]: what a model declares of an output against what its graph computes.
// Type, rank and tensor-or-sequence that differ are refused at the first run, naming the output
// (the export would be a file ONNX Runtime refuses); a fixed dimension that differs is warned of.
TEST_F(Hardening, DeclaredOutputsAreCheckedAgainstWhatTheGraphComputes) {
  const std::string out = (work_.path() / "q.onnx").string();
  auto quantize_proto = [&](const onnx::ModelProto& m) {
    const std::string path = (work_.path() / "declared.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    return run_cli("quantize " + path + " -c " + config_ + " --calib " + kImages + " --calib-count 8 -o " + out);
  };
  onnx::ModelProto m = fixture_proto();
  const std::string y = m.graph().output(0).name();
  auto* type = m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::INT64);
  expect_one_line_error(quantize_proto(m), {"graph output '" + y + "' is declared int64", "the graph computes float [",
                                            "correct the declaration"});
  EXPECT_FALSE(fs::exists(out));

  type->set_elem_type(onnx::TensorProto::FLOAT);
  type->mutable_shape()->add_dim()->set_dim_value(1);  // [N, 10, 1]: a rank the graph does not compute
  expect_one_line_error(quantize_proto(m), {"graph output '" + y + "' is declared float [", ", 10, 1]",
                                            "the graph computes float [8, 10]"});
  EXPECT_FALSE(fs::exists(out));

  m = fixture_proto();
  m.mutable_graph()
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(1)
      ->set_dim_value(7);
  const auto r = quantize_proto(m);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", 7], the graph computes float [8, 10] for this data"), std::string::npos) << r.output;
  fs::remove(out);

  // A sequence where the model declares a tensor.
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}, {"s", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.initializers["w"] = at::randn({8, 16});
  g.append(testing::make_node("fc", "Gemm", {"x", "w"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  g.append(testing::make_node("seq", "SequenceConstruct", {"x", "x"}, {"s"}));
  const std::string seq = (work_.path() / "seq.onnx").string();
  save_onnx(g, ModelMeta{}, seq);  // ONNX's checker lets it through
  expect_one_line_error(
      run_cli("quantize " + seq + " -c " + config_ + " --calib " + samples(at::kFloat).string() + " -o " + out),
      {"graph output 's' is declared a tensor (float [N, 16]) but the graph computes a sequence"});
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Hardening, MessagesSayWhatIsWrongWhereItIs) {
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  expect_one_line_error(run_cli("quantize " + model_ + " -c " + config_ + " --calib /dev/zero" + q),
                        {"/dev/zero", "device, pipe"});
  expect_one_line_error(run_cli("quantize " + model_ + " -c . --calib " + kImages + q), {"is a folder"});
  // A text file named .so in a plugin folder.
  const fs::path plugins = work_.path() / "plugins";
  fs::create_directories(plugins);
  testing::write_text((plugins / "notes.so").string(), "not a library\n");
  auto r = testing::run_command("SPARSEBIT_PLUGIN_PATH=" + plugins.string() + " " + SPARSEBIT_CLI + " plugins");
  EXPECT_NE(r.output.find("no ELF header"), std::string::npos) << r.output;
}

TEST_F(Hardening, GlobsThatMatchNothingWarnAndInvalidGlobsFail) {
  const std::string base = testing::read_text(config_);
  testing::write_text(config_, "skip = [\"/nope/*\"]\n" + base);
  auto r = run_cli(quantize("-o " + (work_.path() / "q.onnx").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skip glob '/nope/*' matches no node"), std::string::npos) << r.output;
  testing::write_text(config_, "skip = [\"[\"]\n" + base);
  expect_one_line_error(run_cli(quantize("-o " + (work_.path() / "q2.onnx").string())),
                        {"skip", "not a valid glob", "never closed"});
  testing::write_text(config_, base + "\n[[specific]]\nnodes = \"/fc9/*\"\nw = { observer = \"minmax\" }\n");
  r = run_cli(quantize("-o " + (work_.path() / "q3.onnx").string()));
  EXPECT_NE(r.output.find("[[specific]] #1 nodes glob '/fc9/*' matches no node"), std::string::npos) << r.output;
  // Thousands of them: ten named, one line for the rest (it was one line each).
  std::string many = "skip = [";
  for (int i = 0; i < 5000; ++i) many += "\"/none" + std::to_string(i) + "/*\", ";
  testing::write_text(config_, many + "]\n" + base);
  r = run_cli(quantize("-o " + (work_.path() / "q4.onnx").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 400);
  std::size_t named = 0;
  for (std::size_t at = 0; (at = r.output.find("matches no node", at)) != std::string::npos; ++at) ++named;
  EXPECT_EQ(named, 10u);
  EXPECT_NE(r.output.find("4990 more globs match no node"), std::string::npos) << r.output.substr(0, 400);
}

TEST_F(Hardening, LabelsThatAreNotLabelsAndQdqModelsAreRefused) {
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  const std::string eval = " --eval-data " + std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz";
  expect_one_line_error(run_cli(quantize(q + eval + " --eval-labels " + kImages)),
                        {"not a label file", "[60000, 28, 28]"});
  // Labels of another task: class 250 for a 10-class model.
  std::string bytes = {0, 0, 0x08, 1, 0, 0, 0x27, 0x10};
  for (int i = 0; i < 10000; ++i) bytes += static_cast<char>(i % 2 ? 250 : 3);
  const std::string labels = (work_.path() / "labels.idx").string();
  std::ofstream(labels, std::ios::binary) << bytes;
  auto r = run_cli(quantize(q + eval + " --eval-labels " + labels));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("outside the model's 10 classes"), std::string::npos) << r.output;
  // The QDQ model just written cannot be quantized again.
  expect_one_line_error(run_cli("quantize " + (work_.path() / "q.onnx").string() + " -c " + config_ + " --calib " +
                                kImages + " -o " + (work_.path() / "qq.onnx").string()),
                        {"already quantized", "QuantizeLinear/DequantizeLinear"});
}

}  // namespace
}  // namespace sparsebit::hardening
