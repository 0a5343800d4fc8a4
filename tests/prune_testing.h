#pragma once
// Helpers for the pruning tests (tests/unit/test_prune.cpp and each sparser plugin's tests).

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "sparsebit/core/prune.h"
#include "test_support.h"

namespace sparsebit::testing {

inline Config sparse_config(const std::string& toml) {
  Config c = Config::from_string(toml, "test.toml");
  c.plugins.use_environment = false;
  return c;
}

/// Prunes a copy of `g` as `toml` says, with one random sample of `input_shape` (seeded).
inline PruneResult run_prune(const Graph& g, const std::string& toml, std::vector<std::int64_t> input_shape) {
  Model m{g.clone(), {}};
  at::manual_seed(7);
  return prune(m, sparse_config(toml), shipped_registry(), {at::randn(input_shape)});
}

}  // namespace sparsebit::testing
