// Float8 Q/DQ models (Note [Float8 Q/DQ]) read by the executor: codes decoded as the formats
// define them (checked by hand), wherever the file keeps them (raw bytes, int32 fields, a
// Constant node); and float8 values anywhere but a Q/DQ input refused by name, since the
// executor holds them as their uint8 codes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "test_support.h"

namespace sparsebit {
namespace {

constexpr int kE4M3 = 17, kE5M2 = 19, kE4M3Fnuz = 18;

/// A model (opset 19 unless told) of one float input x [4] and output y; `build` adds the rest.
std::string model_bytes(const std::function<void(onnx::GraphProto&)>& build, int opset = 19) {
  onnx::ModelProto m;
  m.set_ir_version(opset >= 21 ? 10 : 9);
  m.add_opset_import()->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("float8");
  auto* x = g->add_input();
  x->set_name("x");
  auto* tt = x->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_value(4);
  g->add_output()->set_name("y");
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  build(*g);
  return m.SerializeAsString();
}

onnx::TensorProto codes(const std::string& name, int type, const std::vector<int>& bytes, bool raw) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(type);
  if (bytes.size() != 1) t.add_dims(static_cast<std::int64_t>(bytes.size()));
  if (raw) t.set_raw_data(std::string(bytes.begin(), bytes.end()));
  else
    for (int b : bytes) t.add_int32_data(b);
  return t;
}

onnx::TensorProto scalar(const std::string& name, float v) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_float_data(v);
  return t;
}

void node(onnx::GraphProto& g, const std::string& name, const std::string& op, const std::vector<std::string>& in,
          const std::string& out) {
  auto* n = g.add_node();
  n->set_name(name);
  n->set_op_type(op);
  for (const auto& i : in) n->add_input(i);
  n->add_output(out);
}

at::Tensor run(const std::string& bytes, const at::Tensor& x) {
  const Model m = load_onnx_from_bytes(bytes, "float8.onnx");
  Executor executor(m.graph, testing::shipped_registry());
  return executor.run({{"x", x}})[0];
}

// y = DequantizeLinear(w codes) + x: E4M3FN 0x38 = 1.0 (exponent 7 - bias 7), 0xC0 = -2.0,
// 0x7E = 448 (the largest), 0x01 = 2^-9 (the smallest subnormal); E5M2 0x3C = 1.0, 0xC0 = -2.0,
// 0x7B = 57344, 0x7C = infinity. Scale 0.5.
TEST(Float8Models, DequantizesCodesAsTheFormatsDefineThem) {
  struct Case {
    int type;
    std::vector<int> bytes;
    std::vector<float> values;
  };
  for (const Case& c : {Case{kE4M3, {0x38, 0xC0, 0x7E, 0x01}, {1.0f, -2.0f, 448.0f, std::ldexp(1.0f, -9)}},
                        Case{kE5M2, {0x3C, 0xC0, 0x7B, 0x7C}, {1.0f, -2.0f, 57344.0f, INFINITY}}})
    for (bool raw : {true, false})
      for (bool constant_zero_point : {false, true}) {
        const std::string bytes = model_bytes([&](onnx::GraphProto& g) {
          *g.add_initializer() = codes("w", c.type, c.bytes, raw);
          *g.add_initializer() = scalar("s", 0.5f);
          if (constant_zero_point) {  // old exporters keep parameters in Constant nodes
            auto* n = g.add_node();
            n->set_op_type("Constant");
            n->add_output("zp");
            auto* a = n->add_attribute();
            a->set_name("value");
            a->set_type(onnx::AttributeProto::TENSOR);
            *a->mutable_t() = codes("", c.type, {0}, raw);
          } else {
            *g.add_initializer() = codes("zp", c.type, {0}, raw);
          }
          node(g, "dq", "DequantizeLinear", {"w", "s", "zp"}, "w_f");
          node(g, "add", "Add", {"w_f", "x"}, "y");
        });
        const at::Tensor expected = at::tensor(c.values) * 0.5 + 1.0;
        EXPECT_TRUE(at::equal(run(bytes, at::ones({4})), expected))
            << c.type << (raw ? " raw" : " int32_data") << (constant_zero_point ? " Constant" : "");
      }
}

// x -> QuantizeLinear (E4M3FN, scale 2) -> DequantizeLinear: x / 2 rounded to the nearest value
// (ties to even: 1.0625 lies between 1.0 and 1.125), saturated at 448, then times 2.
TEST(Float8Models, QuantizesThroughTheFormatsGrid) {
  const std::string bytes = model_bytes([](onnx::GraphProto& g) {
    *g.add_initializer() = scalar("s", 2.0f);
    *g.add_initializer() = codes("zp", kE4M3, {0}, true);
    node(g, "q", "QuantizeLinear", {"x", "s", "zp"}, "q");
    node(g, "dq", "DequantizeLinear", {"q", "s", "zp"}, "y");
  });
  const at::Tensor y = run(bytes, at::tensor({2.125f, -3.0f, 1e4f, 0.3f}));
  // 1.0625 -> 1.0; -1.5 exact; 5000 -> 448; 0.15 -> 0.15625 (steps of 2^-6 in [1/8, 1/4): 9.6 -> 10).
  EXPECT_TRUE(at::equal(y, at::tensor({2.0f, -3.0f, 896.0f, 0.3125f}))) << y;
}

TEST(Float8Models, Float8ValuesOutsideQdqAreRefusedByName) {
  using testing::error_of;
  auto import_error = [](const std::string& bytes) {
    return error_of([&] { load_onnx_from_bytes(bytes, "float8.onnx"); });
  };
  // Read by an op that would compute on the codes.
  std::string msg = import_error(model_bytes([](onnx::GraphProto& g) {
    *g.add_initializer() = codes("w", kE4M3, {0x38, 0x38, 0x38, 0x38}, true);
    node(g, "copy", "Identity", {"w"}, "y");
  }));
  EXPECT_NE(msg.find("float8.onnx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'copy' (Identity) reads 'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DequantizeLinear"), std::string::npos) << msg;
  // A QuantizeLinear's float8 output as the graph's output.
  msg = import_error(model_bytes([](onnx::GraphProto& g) {
    *g.add_initializer() = scalar("s", 1.0f);
    *g.add_initializer() = codes("zp", kE5M2, {0}, true);
    node(g, "q", "QuantizeLinear", {"x", "s", "zp"}, "y");
    g.mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(kE5M2);
  }));
  EXPECT_NE(msg.find("graph output 'y' holds float8"), std::string::npos) << msg;
  // The same through opset 21's output_dtype, without a zero point.
  msg = import_error(model_bytes(
      [](onnx::GraphProto& g) {
        *g.add_initializer() = scalar("s", 1.0f);
        node(g, "q", "QuantizeLinear", {"x", "s"}, "y");
        auto* a = g.mutable_node(0)->add_attribute();
        a->set_name("output_dtype");
        a->set_type(onnx::AttributeProto::INT);
        a->set_i(kE4M3);
        g.mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(kE4M3);
      },
      21));
  EXPECT_NE(msg.find("graph output 'y' holds float8"), std::string::npos) << msg;
  // The FNUZ variants are not read.
  msg = import_error(model_bytes([](onnx::GraphProto& g) {
    *g.add_initializer() = scalar("s", 1.0f);
    *g.add_initializer() = codes("zp", kE4M3Fnuz, {0}, true);
    node(g, "q", "QuantizeLinear", {"x", "s", "zp"}, "q");
    node(g, "dq", "DequantizeLinear", {"q", "s", "zp"}, "y");
  }));
  EXPECT_NE(msg.find("'zp'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float8e4m3fnuz"), std::string::npos) << msg;
  // A zero point other than 0, when the executor binds the node.
  msg = error_of([] {
    const Model m = load_onnx_from_bytes(model_bytes([](onnx::GraphProto& g) {
                                           *g.add_initializer() = scalar("s", 1.0f);
                                           *g.add_initializer() = codes("zp", kE4M3, {0x38}, true);
                                           node(g, "q", "QuantizeLinear", {"x", "s", "zp"}, "q");
                                           node(g, "dq", "DequantizeLinear", {"q", "s", "zp"}, "y");
                                         }),
                                         "float8.onnx");
    Executor executor(m.graph, testing::shipped_registry());
  });
  EXPECT_NE(msg.find("(QuantizeLinear)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("zero point other than 0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sparsebit
