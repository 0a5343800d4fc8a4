// The IR's editing operations and the ONNX round trip.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

TEST(OnnxIO, OldOpsetsAreLiftedTo13) {
  // Conv at opset 9 from ONNX's own test data, converted by ONNX's version converter.
  Model m = load_onnx(std::string(ONNX_TESTDATA_DIR) + "/node/test_basic_conv_with_padding/model.onnx");
  EXPECT_GE(m.graph.default_opset(), 13);
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
