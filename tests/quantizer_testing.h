#pragma once
// Helpers for the quantizer plugins' tests: a shipped quantizer by name, per-tensor parameters.

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit::testing {

inline std::unique_ptr<Quantizer> make_quantizer(const std::string& name, const QSpec& spec,
                                                 const Options& options = Options("[test]")) {
  const auto* e = shipped_registry().quantizer(name);
  if (!e) throw Error("quantizer " + name + " not loaded");
  return e->factory(QuantizerContext{spec, options, "test tensor"});
}

inline QParams per_tensor(double scale, int zp = 0) {
  return {at::scalar_tensor(scale, at::kFloat), at::scalar_tensor(zp, at::TensorOptions().dtype(at::kInt))};
}

}  // namespace sparsebit::testing
