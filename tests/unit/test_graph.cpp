// The IR's editing operations and the ONNX round trip.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "base/mapped_file.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/graph.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using testing::make_node;

Graph chain() {
  Graph g;
  g.inputs.push_back({"x", 1, false, {}, ""});
  g.outputs.push_back({"z", 1, false, {}, ""});
  g.opset_imports[""] = 13;
  g.append(make_node("a", "Relu", {"x"}, {"y"}));
  g.append(make_node("b", "Sigmoid", {"y"}, {"z"}));
  return g;
}

TEST(Graph, ProducersConsumersAndReplaceAllUses) {
  Graph g = chain();
  EXPECT_EQ(g.producer("y")->name, "a");
  EXPECT_EQ(g.producer("x"), nullptr);
  auto c = g.consumers("y");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].first->name, "b");
  Node* id = g.insert_after(g.find_node("a"), make_node("id", "Identity", {"y"}, {"y2"}));
  g.replace_all_uses("y", "y2");
  id->inputs[0] = "y";  // the identity itself keeps reading y
  EXPECT_EQ(g.find_node("b")->inputs[0], "y2");
  EXPECT_NO_THROW(g.validate());
  EXPECT_EQ(g.node(1).name, "id");
}

TEST(Graph, TopologicalSortIsStableAndDetectsCycles) {
  Graph g;
  g.inputs.push_back({"x", 1, false, {}, ""});
  g.outputs.push_back({"z", 1, false, {}, ""});
  g.append(make_node("b", "Sigmoid", {"y"}, {"z"}));
  g.append(make_node("a", "Relu", {"x"}, {"y"}));
  g.topological_sort();
  EXPECT_EQ(g.node(0).name, "a");
  EXPECT_EQ(g.node(1).name, "b");

  Graph cyc;
  cyc.inputs.push_back({"x", 1, false, {}, ""});
  cyc.outputs.push_back({"q", 1, false, {}, ""});
  cyc.append(make_node("p", "Add", {"x", "q"}, {"p_out"}));
  cyc.append(make_node("q", "Relu", {"p_out"}, {"q"}));
  EXPECT_THROW(cyc.topological_sort(), Error);
}

TEST(Graph, PruneDeadRemovesUnreadNodesAndInitializers) {
  Graph g = chain();
  g.append(make_node("dead", "Relu", {"x"}, {"unused"}));
  g.append(make_node("dead2", "Relu", {"unused"}, {"unused2"}));
  g.initializers["w"] = at::ones({2});
  EXPECT_EQ(g.prune_dead(), 2u);
  EXPECT_EQ(g.num_nodes(), 2u);
  EXPECT_EQ(g.initializers.count("w"), 0u);
}

TEST(Graph, ValidateNamesTheNodeReadingAnUndefinedTensor) {
  Graph g = chain();
  g.find_node("b")->inputs[0] = "ghost";
  try {
    g.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("ghost"), std::string::npos);
  }
}

TEST(Graph, UniqueNameAvoidsEveryUsedName) {
  Graph g = chain();
  EXPECT_EQ(g.unique_name("y"), "y_1");
  EXPECT_EQ(g.unique_name("fresh"), "fresh");
}

// x -> Relu -> y; If(c) whose then-branch reads y and whose else-branch reads x from the
// enclosing graph (Note [Subgraphs]).
Graph with_if() {
  Graph g;
  g.inputs.push_back({"x", 1, false, {}, ""});
  g.inputs.push_back({"c", 9, false, {}, ""});
  g.outputs.push_back({"z", 1, false, {}, ""});
  g.opset_imports[""] = 13;
  Graph then_branch, else_branch;
  then_branch.outputs.push_back({"t", 1, false, {}, ""});
  then_branch.append(make_node("t_neg", "Neg", {"y"}, {"t"}));
  else_branch.outputs.push_back({"e", 1, false, {}, ""});
  else_branch.append(make_node("e_abs", "Abs", {"x"}, {"e"}));
  Node cond = make_node("if", "If", {"c"}, {"z"});
  cond.attributes["then_branch"] = Attribute::of_graph(std::move(then_branch));
  cond.attributes["else_branch"] = Attribute::of_graph(std::move(else_branch));
  g.append(std::move(cond));  // before the producer of what its branch reads
  g.append(make_node("relu", "Relu", {"x"}, {"y"}));
  return g;
}

TEST(Graph, SubgraphReadsAreImplicitInputsOfTheirNode) {
  Graph g = with_if();
  const Node& cond = *g.find_node("if");
  EXPECT_EQ(cond.implicit_inputs(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(cond.subgraphs().size(), 2u);
  g.topological_sort();  // the If reads y implicitly: it moves after the Relu
  EXPECT_EQ(g.node(0).name, "relu");
  EXPECT_EQ(g.node(1).name, "if");
  EXPECT_NO_THROW(g.validate());
  EXPECT_EQ(g.prune_dead(), 0u);  // y is read only inside the then-branch, yet kept
  g.replace_all_uses("y", "y2");
  g.find_node("relu")->outputs[0] = "y2";
  EXPECT_EQ(g.find_node("if")->subgraphs()[1]->node(0).inputs[0], "y2");  // then_branch sorts after else_branch
  EXPECT_NO_THROW(g.validate());
  const std::string fresh = g.unique_name("t");  // a name used only inside a branch is taken too
  EXPECT_NE(fresh, "t");
  Graph copy = g.clone();  // deep: editing the copy's branch leaves the original's alone
  copy.find_node("if")->attributes.at("then_branch").graph->node(0).op_type = "Abs";
  EXPECT_EQ(g.find_node("if")->attributes.at("then_branch").graph->node(0).op_type, "Neg");
}

TEST(Graph, ValidateNamesTheBranchAndNodeOfAnUnresolvedRead) {
  Graph g = with_if();
  g.topological_sort();
  g.find_node("if")->attributes.at("else_branch").graph->node(0).inputs[0] = "nowhere";
  try {
    g.validate();
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("in 'else_branch' of node 'if' (If)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("node 'e_abs' (Abs) reads tensor 'nowhere'"), std::string::npos) << msg;
  }
}

// ONNX's own If and Loop models: imported with their bodies, written back, read again, and run
// by the executor against the expected outputs.
TEST(OnnxIO, SubgraphsRoundTripAndRun) {
  for (const char* test : {"test_if", "test_loop11", "test_scan9_sum"}) {
    const std::string dir = std::string(ONNX_TESTDATA_DIR) + "/node/" + test;
    Model m = load_onnx(dir + "/model.onnx");
    Model back = load_onnx_from_bytes(serialize_onnx(m.graph, m.meta), test);
    ASSERT_EQ(back.graph.num_nodes(), m.graph.num_nodes()) << test;
    std::size_t bodies = 0;
    for (const Node* n : back.graph.nodes()) bodies += n->subgraphs().size();
    EXPECT_GT(bodies, 0u) << test;
    Executor ex(back.graph, testing::shipped_registry());
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t i = 0; i < back.graph.inputs.size(); ++i)
      feeds[back.graph.inputs[i].name] = load_tensor_pb(dir + "/test_data_set_0/input_" + std::to_string(i) + ".pb");
    auto out = ex.run(feeds);
    for (std::size_t i = 0; i < out.size(); ++i) {
      at::Tensor want = load_tensor_pb(dir + "/test_data_set_0/output_" + std::to_string(i) + ".pb");
      EXPECT_TRUE(at::allclose(out[i].to(want.scalar_type()), want)) << test << " output " << i;
    }
  }
}

// Note [Channels-last convolutions]: Conv computes channels-last on the CPU, the Relu after it
// keeps that layout, and the executor still hands back a standard contiguous output equal to
// ATen's NCHW convolution.
TEST(Executor, ConvOutputsComeBackContiguous) {
  at::manual_seed(5);
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  g.initializers["w"] = at::randn({4, 3, 3, 3});
  g.initializers["b"] = at::randn({4});
  g.append(testing::make_node("conv", "Conv", {"x", "w", "b"}, {"c"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}}));
  g.append(testing::make_node("relu", "Relu", {"c"}, {"y"}));
  Executor ex(g, testing::shipped_registry());
  const at::Tensor x = at::randn({2, 3, 9, 11});
  const auto out = ex.run({{"x", x}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].is_contiguous());
  EXPECT_TRUE(
      at::allclose(out[0], at::relu(at::conv2d(x, g.initializers["w"], g.initializers["b"], 1, 1)), 1e-5, 1e-5));
}

// Note [Host copies of shape constants]: moved to a device, the executor gives the inputs an op
// reads on the host (InputSpec::host) the host copy of a small constant, and every other reader
// the device copy. ATen's meta device has shapes but no values: a shape, pads or slice bounds
// taken from there could not be read at all, and a factor taken from the host would not mix
// with meta data.
TEST(Executor, OpsReadingOnTheHostGetHostCopiesOfSmallConstants) {
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  auto longs = [](std::vector<std::int64_t> v) { return at::tensor(v, at::kLong); };
  g.initializers["shape"] = longs({3, -1});
  g.initializers["pads"] = longs({0, 1, 2, 0});
  g.initializers["starts"] = longs({1});
  g.initializers["ends"] = longs({100});
  g.initializers["axes"] = longs({1});
  g.initializers["factor"] = at::arange(8, at::kFloat);                       // small enough for a host copy too
  g.append(testing::make_node("reshape", "Reshape", {"x", "shape"}, {"r"}));  // 3 x 8
  g.append(testing::make_node("pad", "Pad", {"r", "pads"}, {"p"}));           // 5 x 9
  g.append(testing::make_node("slice", "Slice", {"p", "starts", "ends", "axes"}, {"s"}));  // 5 x 8
  g.append(testing::make_node("mul", "Mul", {"s", "factor"}, {"y"}));
  Executor ex(g, testing::shipped_registry());
  const at::Tensor x = at::randn({2, 3, 4});
  const at::Tensor expected = ex.run({{"x", x}})[0];
  EXPECT_EQ(expected.sizes(), (std::vector<std::int64_t>{5, 8}));
  ex.to("meta");
  const auto out = ex.run({{"x", x.to(at::kMeta)}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].is_meta());
  EXPECT_EQ(out[0].sizes(), expected.sizes());
}

TEST(OnnxIO, RoundTripKeepsNodesAttributesAndInitializers) {
  Model m = load_onnx(testing::fixture_model());
  EXPECT_EQ(m.graph.default_opset(), 13);
  ASSERT_EQ(m.graph.inputs.size(), 1u);
  EXPECT_EQ(m.graph.inputs[0].name, "image");
  EXPECT_EQ(m.graph.inputs[0].shape[0].param, "batch");
  // The exporter's Constant node became an initializer.
  for (const Node* n : m.graph.nodes()) EXPECT_NE(n->op_type, "Constant");
  std::string bytes = serialize_onnx(m.graph, m.meta);
  Model back = load_onnx_from_bytes(bytes, "roundtrip");
  ASSERT_EQ(back.graph.num_nodes(), m.graph.num_nodes());
  for (std::size_t i = 0; i < m.graph.num_nodes(); ++i) {
    EXPECT_EQ(back.graph.node(i).op_type, m.graph.node(i).op_type);
    EXPECT_EQ(back.graph.node(i).inputs, m.graph.node(i).inputs);
    EXPECT_EQ(back.graph.node(i).attributes.size(), m.graph.node(i).attributes.size());
  }
  for (const auto& [name, t] : m.graph.initializers)
    EXPECT_TRUE(at::equal(t, back.graph.initializers.at(name))) << name;
}

std::int64_t rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Note [Mapped weights]: a large tensor of external data is read only when touched, a change
// made in place (as a pass scales a weight) stays in memory and never reaches the file, and
// writing the model over its own files leaves the loaded tensors intact.
TEST(OnnxIO, ExternalWeightsAreMappedCopyOnWrite) {
  testing::TempDir dir;
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  g.initializers["w"] = at::randn({1024, 16384});  // 64 MiB
  g.initializers["small"] = at::randn({16, 16});
  g.append(testing::make_node("mm", "MatMul", {"x", "w"}, {"y"}));
  ExportOptions ext;
  ext.external_data = true;
  ext.run_checker = false;  // a bare graph without value shapes
  save_onnx(g, ModelMeta{}, dir / "m.onnx", ext);
  const std::string data_before = file_bytes(dir / "m.onnx.data");

  const std::int64_t before = rss_kib();
  Model m = load_onnx(dir / "m.onnx");
  const std::int64_t loaded = rss_kib();
  EXPECT_LT(loaded - before, 32 * 1024) << "the 64 MiB weight is not read at load";
  at::Tensor w = m.graph.initializers.at("w");
  ASSERT_TRUE(at::equal(w, g.initializers.at("w")));
  EXPECT_GT(rss_kib() - loaded, 48 * 1024) << "reading it brings it in";
  EXPECT_TRUE(at::equal(m.graph.initializers.at("small"), g.initializers.at("small")));

  w.mul_(2);  // in place, as a pass folds a scale
  EXPECT_TRUE(at::equal(w, g.initializers.at("w") * 2));
  EXPECT_EQ(file_bytes(dir / "m.onnx.data"), data_before) << "the change stays in memory";

  save_onnx(m.graph, m.meta, dir / "m.onnx", ext);  // over the files the tensor is mapped from
  EXPECT_TRUE(at::equal(w, g.initializers.at("w") * 2));
  Model back = load_onnx(dir / "m.onnx");
  EXPECT_TRUE(at::equal(back.graph.initializers.at("w"), g.initializers.at("w") * 2));
}

// Packed and narrowed types (int4, uint4, uint16) in the side file, as a model over 1 GiB is
// exported whole, read back to the same values: an odd count of 4-bit values leaves half a byte.
TEST(OnnxIO, FourBitAndUint16WeightsReadBackFromExternalData) {
  testing::TempDir dir;
  Graph g;
  g.opset_imports[""] = 21;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  g.initializers["i4"] = at::randint(-8, 8, {129, 33}, at::TensorOptions().dtype(at::kChar));
  g.initializers["u4"] = at::randint(0, 16, {257}, at::TensorOptions().dtype(at::kByte));
  g.initializers["u16"] = at::randint(0, 65536, {600}, at::TensorOptions().dtype(at::kInt));
  g.narrow_types = {{"i4", 22}, {"u4", 21}, {"u16", 4}};
  for (const char* w : {"i4", "u4", "u16"})
    g.append(testing::make_node(std::string("id_") + w, "Identity", {w}, {w + std::string("_out")}));
  g.append(testing::make_node("copy", "Identity", {"x"}, {"y"}));
  ExportOptions ext;
  ext.external_data = true;
  ext.external_min_bytes = 1;
  ext.run_checker = false;
  save_onnx(g, ModelMeta{}, dir / "m.onnx", ext);
  ASSERT_GT(std::filesystem::file_size(dir / "m.onnx.data"), std::uintmax_t{129 * 33 / 2 + 128 + 1200});
  const Model back = load_onnx(dir / "m.onnx");
  for (const char* w : {"i4", "u4", "u16"}) {
    const at::Tensor& got = back.graph.initializers.at(w);
    EXPECT_EQ(got.sizes(), g.initializers.at(w).sizes()) << w;
    EXPECT_TRUE(at::equal(got.to(at::kInt), g.initializers.at(w).to(at::kInt))) << w;
  }
}

// Note [Spilled weights]: a weight a pass wrote moves to an unnamed file and is mapped from there:
// same values, out of resident memory until read, changes in place still possible, and nothing
// left in the temporary folder.
TEST(OnnxIO, WeightsAPassWroteSpillToAFileAndStayTheSame) {
  testing::TempDir dir;
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  setenv("TMPDIR", dir.path().c_str(), 1);
  at::Tensor heap = at::randn({1024, 16384});  // 64 MiB
  const at::Tensor expected = heap.clone();
  const std::int64_t with_heap = rss_kib();
  at::Tensor spilled = spill(heap);
  heap.reset();
  const std::int64_t after = rss_kib();
  if (old_tmpdir) setenv("TMPDIR", saved.c_str(), 1);
  else unsetenv("TMPDIR");
  ASSERT_TRUE(is_mapped(spilled));
  EXPECT_LT(after, with_heap - 48 * 1024) << "the heap copy is gone and the file's pages are not resident";
  EXPECT_TRUE(at::equal(spilled, expected));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the file has no name";
  spilled.mul_(2);
  EXPECT_TRUE(at::equal(spilled, expected * 2));
  const at::Tensor small = at::ones({4});
  EXPECT_FALSE(is_mapped(small));
  EXPECT_TRUE(is_mapped(spill(small)));
}

TEST(OnnxIO, OldOpsetsAreLiftedTo13) {
  // Conv at opset 9 from ONNX's own test data, converted by ONNX's version converter.
  const std::string path = std::string(ONNX_TESTDATA_DIR) + "/node/test_basic_conv_with_padding/model.onnx";
  const Model kept = load_onnx(path);  // by default the model keeps its opset
  EXPECT_LT(kept.graph.default_opset(), 13);
  const Model m = load_onnx(path, ImportOptions{13, &testing::shipped_registry()});
  EXPECT_EQ(m.graph.default_opset(), 13);
  const std::string why = testing::error_of([&] { load_onnx(path, ImportOptions{13}); });
  EXPECT_NE(why.find("ImportOptions::min_opset needs ImportOptions::registry"), std::string::npos) << why;
}

TEST(OnnxIO, GarbageAndTruncatedFilesAreClearErrors) {
  testing::TempDir dir;
  testing::write_text(dir / "junk.onnx", "this is not a protobuf at all \x01\x02\x03");
  try {
    load_onnx(dir / "junk.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.onnx"), std::string::npos) << e.what();
  }
  std::ifstream in(testing::fixture_model(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THROW(load_onnx_from_bytes(bytes.substr(0, bytes.size() / 2), "half.onnx"), Error);
  EXPECT_THROW(load_onnx_from_bytes("", "empty.onnx"), Error);
}

}  // namespace
}  // namespace sparsebit
