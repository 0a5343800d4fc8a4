#pragma once
// Helpers for the observer tests (tests/unit/test_observers.cpp and each observer plugin's
// tests): making a shipped observer, and the numpy reference of tests/observers/.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit::testing {

inline QSpec symmetric8(bool weight) {
  QSpec s;
  s.is_weight = weight;
  return s;
}

inline std::unique_ptr<Observer> make_observer(const std::string& name, const QSpec& spec,
                                               const Options& options = Options("[test]")) {
  const auto* e = shipped_registry().observer(name);
  if (!e) throw Error("observer " + name + " not loaded");
  return e->factory(ObserverContext{spec, options, "test tensor"});
}

struct Reference {
  at::Tensor data;
  nlohmann::json values;
  Reference() {
    data = read_npy(source_path("tests/observers/data.npy"));
    std::ifstream in(source_path("tests/observers/reference.json"));
    values = nlohmann::json::parse(in);
  }
  QParams expected(const std::string& key, const QSpec& spec) const {
    return qparams_from_range(at::scalar_tensor(values[key][0].get<double>()),
                              at::scalar_tensor(values[key][1].get<double>()), spec, key);
  }
};

inline const Reference& reference() {
  static Reference r;
  return r;
}

inline void expect_scale_near(const QParams& got, const QParams& want, double rtol, const std::string& what) {
  const double g = got.scale.item<double>(), w = want.scale.item<double>();
  EXPECT_NEAR(g, w, rtol * w) << what << ": scale " << g << " vs reference " << w;
}

inline QParams observe_exact(const std::string& name, const Options& options = Options("[test]")) {
  auto obs = make_observer(name, symmetric8(true), options);
  obs->observe(reference().data);
  return obs->compute();
}

inline QParams observe_streaming(const std::string& name, const Options& options = Options("[test]")) {
  auto obs = make_observer(name, symmetric8(false), options);
  for (const auto& chunk : reference().data.chunk(8)) obs->observe(chunk.reshape({-1, 8}));
  return obs->compute();
}

}  // namespace sparsebit::testing
