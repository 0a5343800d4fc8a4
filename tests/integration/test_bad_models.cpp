// Malformed models: each must fail with an error that names the node (and what is wrong), at
// import or when the executor binds its QModules, never with a crash or a wrong result.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <functional>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

/// A one-input (x: float [1,3,4,4]) opset-17 model; `build` adds nodes and initializers.
std::string model_bytes(const std::function<void(onnx::GraphProto&)>& build) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("bad");
  auto* x = g->add_input();
  x->set_name("x");
  auto* tt = x->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : {1, 3, 4, 4}) tt->mutable_shape()->add_dim()->set_dim_value(d);
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  build(*g);
  return m.SerializeAsString();
}

onnx::NodeProto* node(onnx::GraphProto& g, const std::string& name, const std::string& op,
                      std::initializer_list<const char*> inputs, const char* output = "y") {
  auto* n = g.add_node();
  n->set_name(name);
  n->set_op_type(op);
  for (const char* i : inputs) n->add_input(i);
  n->add_output(output);
  return n;
}

void int_attr(onnx::NodeProto* n, const std::string& key, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(key);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void string_attr(onnx::NodeProto* n, const std::string& key, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(key);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

void initializer(onnx::GraphProto& g, const std::string& name, int type, std::vector<std::int64_t> dims,
                 std::vector<float> values) {
  auto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (auto d : dims) t->add_dims(d);
  for (float v : values) {
    if (type == onnx::TensorProto::FLOAT) t->add_float_data(v);
    else t->add_int64_data(static_cast<std::int64_t>(v));
  }
}

using testing::error_of;

std::string import_error(const std::string& bytes) {
  return error_of([&] { load_onnx_from_bytes(bytes, "bad.onnx"); });
}

/// Imports, binds QModules and runs once on a [1,3,4,4] input.
std::string run_error(const std::string& bytes) {
  return error_of([&] {
    Model m = load_onnx_from_bytes(bytes, "bad.onnx");
    Executor ex(m.graph, testing::shipped_registry());
    ex.run({{"x", at::rand({1, 3, 4, 4})}});
  });
}

TEST(BadModels, MissingRequiredInputNamesNodeAndSpec) {
  auto msg = import_error(model_bytes([](auto& g) { node(g, "gather1", "Gather", {"x"}); }));
  EXPECT_NE(msg.find("node 'gather1' (Gather)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Gather-13"), std::string::npos) << msg;
  EXPECT_NE(msg.find("input size 1"), std::string::npos) << msg;
}

TEST(BadModels, AttributeOfTheWrongKind) {
  auto msg = import_error(model_bytes([](auto& g) { string_attr(node(g, "sm", "Softmax", {"x"}), "axis", "one"); }));
  EXPECT_NE(msg.find("node 'sm' (Softmax)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("attribute type"), std::string::npos) << msg;
}

TEST(BadModels, InitializerOfTheWrongElementType) {
  auto msg = import_error(model_bytes([](auto& g) {
    initializer(g, "shape", onnx::TensorProto::FLOAT, {2}, {1, -1});
    node(g, "reshape1", "Reshape", {"x", "shape"});
  }));
  EXPECT_NE(msg.find("node 'reshape1' (Reshape)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'shape'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is float"), std::string::npos) << msg;
}

TEST(BadModels, CycleAndUndefinedValue) {
  auto msg = import_error(model_bytes([](auto& g) {
    node(g, "a", "Relu", {"z"}, "w");
    node(g, "b", "Add", {"x", "w"}, "z");
    node(g, "c", "Relu", {"z"});
  }));
  EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(Relu)"), std::string::npos) << msg;
  msg = import_error(model_bytes([](auto& g) { node(g, "add1", "Add", {"x", "nope"}); }));
  EXPECT_NE(msg.find("node 'add1' (Add)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
}

TEST(BadModels, AttributeValuesOutsideTheSpec) {
  auto msg = run_error(model_bytes([](auto& g) {
    initializer(g, "scales", onnx::TensorProto::FLOAT, {4}, {1, 1, 2, 2});
    string_attr(node(g, "resize1", "Resize", {"x", "", "scales"}), "mode", "bogus");
  }));
  EXPECT_NE(msg.find("node 'resize1' (Resize)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mode 'bogus'"), std::string::npos) << msg;
  msg = run_error(model_bytes([](auto& g) {
    initializer(g, "w", onnx::TensorProto::FLOAT, {3, 3, 1, 1}, std::vector<float>(9, 1.0f));
    int_attr(node(g, "conv1", "Conv", {"x", "w"}), "group", 0);
  }));
  EXPECT_NE(msg.find("node 'conv1' (Conv)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("group"), std::string::npos) << msg;
  msg = run_error(model_bytes([](auto& g) { int_attr(node(g, "sm", "Softmax", {"x"}), "axis", 7); }));
  EXPECT_NE(msg.find("node 'sm' (Softmax)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("axis 7"), std::string::npos) << msg;
}

TEST(BadModels, DataDependentErrorsNameTheNode) {
  auto msg = run_error(model_bytes([](auto& g) {
    initializer(g, "idx", onnx::TensorProto::INT64, {2}, {0, 9});
    int_attr(node(g, "gather1", "Gather", {"x", "idx"}), "axis", 1);
  }));
  EXPECT_NE(msg.find("node 'gather1' (Gather)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("index 9"), std::string::npos) << msg;
  msg = run_error(model_bytes([](auto& g) {
    initializer(g, "split", onnx::TensorProto::INT64, {2}, {1, 1});
    auto* n = node(g, "split1", "Split", {"x", "split"});
    n->add_output("y2");
    int_attr(n, "axis", 1);
  }));
  EXPECT_NE(msg.find("node 'split1' (Split)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("add up to 2"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparsebit
