// ONNX's backend tests (libonnx-testdata: data/node, data/pytorch-converted,
// data/pytorch-operator, plus tests/conformance/extra for newer opsets): every model whose ops the shipped plugins (and
// the executor's own control flow: If, Loop, Scan) all provide, inside subgraphs too, runs through the executor and
// must match the expected outputs with ONNX's own tolerances (rtol 1e-3, atol 1e-7). Prints ran/passed/failed per op;
// docs/OPERATORS.md lists the known failures.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <set>

#include <onnx/onnx_pb.h>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;

// Tests whose expected outputs cannot be reproduced by any implementation, with the reason.
const std::map<std::string, std::string> kNotReproducible = {
    {"test_training_dropout", "random mask drawn by numpy's RNG"},
    {"test_training_dropout_default", "random mask drawn by numpy's RNG"},
    {"test_training_dropout_default_mask", "random mask drawn by numpy's RNG"},
    {"test_training_dropout_mask", "random mask drawn by numpy's RNG"},
};

// Applicable tests that fail, with the reason (also in docs/OPERATORS.md). A listed test that
// starts passing fails this test too, so the list stays true.
const std::map<std::string, std::string> kKnownFailures = {
    {"test_cast_FLOAT_to_BFLOAT16",
     "ONNX 1.12's reference truncates to bfloat16; ATen (and ONNX >= 1.14) round to nearest even"},
    {"test_castlike_FLOAT_to_BFLOAT16", "ONNX 1.12's reference truncates to bfloat16; ATen rounds to nearest even"},
    {"test_castlike_FLOAT_to_BFLOAT16_expanded",
     "ONNX 1.12's reference truncates to bfloat16; ATen rounds to nearest even"},
    {"test_cast_FLOAT_to_STRING", "string tensors: LibTorch has no string dtype"},
    {"test_cast_STRING_to_FLOAT", "string tensors: LibTorch has no string dtype"},
    {"test_castlike_FLOAT_to_STRING", "string tensors: LibTorch has no string dtype"},
    {"test_castlike_FLOAT_to_STRING_expanded", "string tensors: LibTorch has no string dtype"},
    {"test_castlike_STRING_to_FLOAT", "string tensors: LibTorch has no string dtype"},
    {"test_castlike_STRING_to_FLOAT_expanded", "string tensors: LibTorch has no string dtype"},
    {"test_loop16_seq_none",
     "a sequence whose elements differ in rank (a 0-d tensor, then 1-D slices): sequences travel as nested tensors, "
     "whose elements share one rank"},
    {"test_max_uint32", "uint32 tensors: LibTorch 1.13 has no uint32 dtype"},
    {"test_max_uint64", "uint64 tensors: LibTorch 1.13 has no uint64 dtype"},
    {"test_min_uint32", "uint32 tensors: LibTorch 1.13 has no uint32 dtype"},
    {"test_min_uint64", "uint64 tensors: LibTorch 1.13 has no uint64 dtype"},
    {"test_mod_uint32", "uint32 tensors: LibTorch 1.13 has no uint32 dtype"},
    {"test_mod_uint64", "uint64 tensors: LibTorch 1.13 has no uint64 dtype"},
    {"test_pow_types_float32_uint32", "uint32 tensors: LibTorch 1.13 has no uint32 dtype"},
    {"test_pow_types_float32_uint64", "uint64 tensors: LibTorch 1.13 has no uint64 dtype"},
};

bool close(const at::Tensor& got, const at::Tensor& want, std::string* why) {
  if (!want.defined() || !got.defined()) {  // an optional without an element
    if (want.defined() != got.defined()) *why = got.defined() ? "an element, expected none" : "no element";
    return want.defined() == got.defined();
  }
  if (want.is_nested() || got.is_nested()) {  // sequences: element by element
    if (!want.is_nested() || !got.is_nested()) {
      *why = "a sequence and a tensor";
      return false;
    }
    const auto g = got.unbind(), w = want.unbind();
    if (g.size() != w.size()) {
      *why = "sequence of " + std::to_string(g.size()) + " elements, expected " + std::to_string(w.size());
      return false;
    }
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!close(g[i], w[i], why)) {
        *why = "element " + std::to_string(i) + ": " + *why;
        return false;
      }
    return true;
  }
  if (got.sizes() != want.sizes()) {
    *why = "shape " + c10::str(got.sizes()) + " vs expected " + c10::str(want.sizes());
    return false;
  }
  if (!want.is_floating_point()) {
    if (!at::equal(got.to(want.scalar_type()), want)) {
      *why = "integer values differ";
      return false;
    }
    return true;
  }
  at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  at::Tensor bad = (g - w).abs() > (w.abs() * 1e-3 + 1e-7);
  bad = at::logical_and(bad, at::logical_not(at::logical_and(at::isnan(g), at::isnan(w))));
  bad = at::logical_or(bad, at::logical_xor(at::isnan(g), at::isnan(w)));
  if (bad.any().item<bool>()) {
    *why = "max abs diff " + std::to_string((g - w).abs().nan_to_num(0).max().item<double>());
    return false;
  }
  return true;
}

// The test data store bfloat16 values as their uint16 bit patterns.
at::Tensor as_declared(at::Tensor t, std::int32_t elem_type) {
  if (elem_type == onnx::TensorProto::BFLOAT16 && t.scalar_type() != at::kBFloat16) {
    at::Tensor bits = t.to(at::kInt).to(at::kShort).contiguous();
    return at::from_blob(bits.data_ptr(), bits.sizes(), at::kBFloat16).clone();
  }
  return t;
}

// Op types of a model file, read straight from the protobuf (also for models the importer
// refuses, so that they still count).
void collect_ops(const onnx::GraphProto& g, std::set<std::string>& ops) {
  for (const auto& n : g.node()) {
    ops.insert((n.domain().empty() || n.domain() == "ai.onnx" ? "" : n.domain() + ":") + n.op_type());
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_ops(a.g(), ops);  // the ops of If / Loop / Scan bodies count too
      for (const auto& sub : a.graphs()) collect_ops(sub, ops);
    }
  }
}

std::set<std::string> op_types(const fs::path& model) {
  onnx::ModelProto m;
  std::ifstream f(model, std::ios::binary);
  std::set<std::string> ops;
  if (!m.ParseFromIstream(&f)) return ops;
  collect_ops(m.graph(), ops);
  return ops;
}

struct OpTally {
  int ran = 0, passed = 0;
};

TEST(OnnxNodeConformance, EverySupportedOpTestMatches) {
  const Registry& reg = testing::shipped_registry();
  std::vector<fs::path> dirs;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator"}) {
    const fs::path root = fs::path(ONNX_TESTDATA_DIR) / suite;
    ASSERT_TRUE(fs::is_directory(root)) << "install libonnx-testdata";
    for (const auto& e : fs::directory_iterator(root))
      if (e.is_directory()) dirs.push_back(e.path());
  }
  // Ops whose opsets are newer than the installed test data, expected outputs from PyTorch
  // (tests/conformance/make_extra_cases.py).
  for (const auto& e : fs::directory_iterator(fs::path(SPARSEBIT_SOURCE_DIR) / "tests/conformance/extra"))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());

  int ran = 0, passed = 0, cases = 0, known = 0;
  std::map<std::string, OpTally> by_op;
  std::vector<std::string> failures, skipped;
  for (const auto& dir : dirs) {
    const std::string name = dir.filename().string();
    const std::set<std::string> ops = op_types(dir / "model.onnx");
    bool supported = !ops.empty();
    for (const auto& op : ops)
      supported = supported && (op == "Constant" || op == "If" || op == "Loop" || op == "Scan" || op == "SequenceMap" ||
                                reg.op(op, ""));
    if (!supported) continue;
    if (kNotReproducible.count(name)) {
      skipped.push_back(name + " (" + kNotReproducible.at(name) + ")");
      continue;
    }
    bool ok = true;
    std::string detail;
    try {
      Model model = load_onnx((dir / "model.onnx").string());
      auto type_of = [&](const std::string& value) {  // sequence or optional type, else ""
        auto t = model.meta.value_types.find(value);
        return t == model.meta.value_types.end() ? std::string() : t->second;
      };
      Executor ex(model.graph, reg);
      for (const auto& set : fs::directory_iterator(dir)) {
        if (!set.is_directory() || set.path().filename().string().rfind("test_data_set_", 0) != 0) continue;
        std::map<std::string, at::Tensor> feeds;
        for (std::size_t i = 0; i < model.graph.inputs.size(); ++i)
          feeds[model.graph.inputs[i].name] =
              as_declared(load_value_pb((set.path() / ("input_" + std::to_string(i) + ".pb")).string(),
                                        type_of(model.graph.inputs[i].name)),
                          model.graph.inputs[i].elem_type);
        auto outs = ex.run(feeds);
        ++cases;
        for (std::size_t i = 0; i < outs.size(); ++i) {
          at::Tensor want = as_declared(load_value_pb((set.path() / ("output_" + std::to_string(i) + ".pb")).string(),
                                                      type_of(model.graph.outputs[i].name)),
                                        model.graph.outputs[i].elem_type);
          std::string why;
          if (!close(outs[i], want, &why)) {
            ok = false;
            detail += " output " + std::to_string(i) + ": " + why + ";";
          }
        }
      }
    } catch (const std::exception& e) {
      ok = false;
      detail = e.what();
    }
    ++ran;
    for (const auto& op : ops) {
      ++by_op[op].ran;
      if (ok) ++by_op[op].passed;
    }
    const bool expected_failure = kKnownFailures.count(name) != 0;
    if (ok) ++passed;
    if (ok && expected_failure)
      failures.push_back(name + ": passes now; remove it from kKnownFailures and docs/OPERATORS.md");
    if (!ok && expected_failure) ++known;
    if (!ok && !expected_failure) failures.push_back(name + ":" + detail);
  }
  std::printf("ONNX backend tests: %d applicable ran (%d data sets), %d passed, %d failed (%d known), %zu skipped\n",
              ran, cases, passed, ran - passed, known, skipped.size());
  std::printf("%-26s %5s %6s %6s\n", "op", "ran", "passed", "failed");
  for (const auto& [op, t] : by_op) std::printf("%-26s %5d %6d %6d\n", op.c_str(), t.ran, t.passed, t.ran - t.passed);
  for (const auto& s : skipped) std::printf("  skipped %s\n", s.c_str());
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GE(ran, 720) << "fewer backend tests than expected were selected";
  EXPECT_GE(passed * 100, ran * 97) << "pass rate below 97%";
  // A table of op names, packed (not one per line):
  // clang-format off
  for (const char* op : {"Conv", "Gemm", "MatMul", "BatchNormalization", "Relu", "Clip", "Sigmoid", "HardSigmoid", "Add",
                         "Mul", "MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Concat",
                         "Softmax", "Identity", "Dropout", "Resize", "LayerNormalization", "Gather", "Slice", "Einsum",
                         "Gelu", "Mish", "GroupNormalization"})
    EXPECT_GT(by_op[op].ran, 0) << op << " has no backend test that ran";
  // clang-format on
}

}  // namespace
}  // namespace sparsebit
