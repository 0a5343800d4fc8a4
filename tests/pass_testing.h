#pragma once
// Helpers for the pass tests (the SDK's pattern matcher and each pass plugin's tests): small
// graphs, and a pass applied with the outputs compared through the executor.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparsebit/core/executor.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/sdk/pattern.h"
#include "test_support.h"

namespace sparsebit::testing {

inline std::vector<std::string> ops(const Graph& g) {
  std::vector<std::string> out;
  for (const Node* n : g.nodes()) out.push_back(n->op_type);
  return out;
}

inline at::Tensor run(const Graph& g, const at::Tensor& x) {
  Executor ex(g, shipped_registry());
  return ex.run({{"x", x}})[0];
}

/// Runs `pass` on a copy of `g`; checks it changed the graph and kept the outputs.
inline Graph apply_and_compare(const Graph& g, const std::string& pass, const at::Tensor& x) {
  Graph after = g.clone();
  EXPECT_TRUE(run_simplify_pass(pass, after, shipped_registry())) << pass << " did nothing";
  const at::Tensor want = run(g, x), got = run(after, x);
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * std::max(1.0, want.abs().max().item<double>())) << pass;
  return after;
}

inline Builder relu_chain(int n) {
  Builder b({2, 3});
  std::string prev = "x";
  for (int i = 0; i < n; ++i) {
    const std::string out = i + 1 == n ? "y" : "r" + std::to_string(i);
    b.add("relu" + std::to_string(i), "Relu", {prev}, {out});
    prev = out;
  }
  return b;
}

inline Pattern relu_pair() {
  Pattern p;
  p.node("a", {"Relu"});
  p.node("b", {"Relu"}, {"a"});
  return p;
}

}  // namespace sparsebit::testing
