#pragma once
// Helpers for the op plugins' tests: one op alone in a model (or a few nodes), run by our
// executor and by ONNX Runtime on the same inputs, every output compared.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "test_support.h"

namespace sparsebit::testing {

/// One node: its op, attributes, named inputs ("" leaves an optional input out) and outputs.
struct OpCase {
  std::string op, domain;
  std::map<std::string, Attribute> attributes;
  std::vector<std::pair<std::string, at::Tensor>> inputs;
  std::vector<std::string> outputs;
  std::int64_t opset = 17;
};

inline ValueInfo value_of(const std::string& name, const at::Tensor* t = nullptr) {
  ValueInfo v;
  v.name = name;
  v.elem_type = t ? onnx_type_of(t->scalar_type()) : 1;
  if (t) {
    v.has_shape = true;
    for (auto d : t->sizes()) v.shape.push_back(Dim{d, ""});
  }
  return v;
}

inline Graph single_node(const OpCase& c) {
  Graph g;
  g.opset_imports[""] = c.opset;
  if (!c.domain.empty()) g.opset_imports[c.domain] = 1;
  Node n;
  n.name = c.op + "_0";
  n.op_type = c.op;
  n.domain = c.domain;
  n.attributes = c.attributes;
  for (const auto& [name, t] : c.inputs) {
    n.inputs.push_back(name);
    if (!name.empty()) g.inputs.push_back(value_of(name, &t));
  }
  n.outputs = c.outputs;
  for (const auto& o : c.outputs) g.outputs.push_back(value_of(o));
  g.append(std::move(n));
  return g;
}

/// Our executor and ONNX Runtime (optimizations off) on `feeds`; every output of `g` within
/// atol + rtol |ort|, of ONNX Runtime's shape. `what` names the case in failures.
inline void expect_graph_matches_ort(Graph g, const std::map<std::string, at::Tensor>& feeds, const std::string& what,
                                     double atol = 2e-5, double rtol = 1e-4) {
  TempDir dir;
  std::string args;
  for (const auto& [name, t] : feeds) {
    write_npy(t, dir / (name + ".npy"));
    args += " --in " + name + "=" + (dir / (name + ".npy"));
  }
  // Outputs are declared from what our executor computes (below): until then their type is open,
  // so that the executor's check of declared outputs has nothing to compare.
  for (auto& o : g.outputs)
    if (!o.has_shape) o.elem_type = 0;
  std::vector<at::Tensor> got;
  {
    Executor ours(g, shipped_registry());
    got = ours.run(feeds);
  }
  ASSERT_EQ(got.size(), g.outputs.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    g.outputs[i] = value_of(g.outputs[i].name, &got[i]);  // the checker wants shapes
  const std::string model = dir / "model.onnx";
  save_onnx(g, ModelMeta{}, model);
  for (const auto& o : g.outputs) args += " --out " + o.name + "=" + (dir / (o.name + ".npy"));
  const auto r = run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " + model +
                             " --optimization disabled" + args);
  ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::string& name = g.outputs[i].name;
    const at::Tensor want = read_npy(dir / (name + ".npy")).to(at::kDouble);
    ASSERT_EQ(got[i].sizes(), want.sizes()) << what << " output " << name;
    const at::Tensor ours = got[i].to(at::kDouble);
    const double worst = want.numel() == 0 ? 0.0 : ((ours - want).abs() - rtol * want.abs()).max().item<double>();
    EXPECT_LE(worst, atol) << what << " output " << name;
  }
}

inline void expect_matches_ort(const OpCase& c, double atol = 2e-5, double rtol = 1e-4) {
  std::map<std::string, at::Tensor> feeds;
  for (const auto& [name, t] : c.inputs)
    if (!name.empty()) feeds[name] = t;
  expect_graph_matches_ort(single_node(c), feeds, c.op, atol, rtol);
}

/// Skips where ONNX Runtime is not installed; seeds the generator.
class OrtOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
    at::manual_seed(7);
  }
};

}  // namespace sparsebit::testing
