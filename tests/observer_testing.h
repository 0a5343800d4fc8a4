#pragma once
// Helpers for the observer tests (tests/unit/test_observers.cpp and each observer plugin's
// tests): making a shipped observer, and the numpy reference of tests/observers/.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

/// An activation of PP-OCRv4's recognizer (tests/observers/NAME_hist.npy: the counts of its
/// 3,686,400 values over 16 lines in 8,192 bins over [-range, range]), as the bin centres
/// repeated by their counts.
inline at::Tensor real_activation(const std::string& name, double range) {
  const at::Tensor counts = read_npy(source_path("tests/observers/" + name + "_hist.npy")).to(at::kLong);
  const std::int64_t bins = counts.numel();
  const at::Tensor centers =
      (at::arange(bins, at::TensorOptions().dtype(at::kDouble)) + 0.5) * (2 * range / double(bins)) - range;
  return at::repeat_interleave(centers.to(at::kFloat), counts);
}

/// The two of them: a spike just off zero with a long tail that matters downstream.
inline std::vector<std::pair<std::string, at::Tensor>> real_activations() {
  return {{"conv14 input", real_activation("ppocr_rec_conv14_input", 0.5)},
          {"add178 input", real_activation("ppocr_rec_add178_input", 8.0)}};
}

/// Note [Clipping floor], by hand: the |x| that keeps all but 0.1% of the non-zero values.
inline double clipping_floor(const at::Tensor& x) {
  const at::Tensor a = x.to(at::kDouble).abs().reshape({-1});
  const at::Tensor nz = a.masked_select(a != 0);
  const auto k = static_cast<std::int64_t>(std::ceil((1 - 1e-3) * double(nz.numel())));
  return std::get<0>(at::kthvalue(nz, std::max<std::int64_t>(k, 1))).item<double>();
}

}  // namespace sparsebit::testing
