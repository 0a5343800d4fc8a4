// The template's own test, built from the installed SDK alone (no test framework needed): it
// opens the built plugin with the SDK's test kit (sparsebit/sdk/testing.h) as the host would,
// then checks the op and the observer against values computed by hand. Run with `ctest` in the
// build folder. Sparsebit's own plugin tests are written against the same kit.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "sparsebit/sdk/testing.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

}  // namespace

int main() {
  // The plugin as built, opened and checked as the host opens it (sparsebit/sdk/testing.h).
  const sparsebit::testing::PluginUnderTest plugin(SPARSEBIT_PLUGIN_FILE);
  const auto& r = plugin.registered();
  check(r.ops.count("com.example:LayerScale") == 1, "LayerScale registered in com.example");
  check(r.observers.count("mean_range") == 1, "mean_range registered");
  check(r.backends.count("example_npu") == 1, "example_npu registered");
  if (failures) return 1;

  // LayerScale: y = x * gamma along the last axis. By hand: [[1, 2], [3, 4]] * [10, -1].
  sparsebit::testing::OneNode scale("LayerScale", "com.example", 1);
  scale.name("scale0");
  const at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2});
  auto op = scale.make(plugin, {x, at::tensor({10.0f, -1.0f})});
  const at::Tensor y = op->forward({x, at::tensor({10.0f, -1.0f})}).at(0);
  check(at::equal(y, at::tensor({10.0f, -2.0f, 30.0f, -4.0f}).reshape({2, 2})), "LayerScale computes x * gamma");
  check(op->input_specs().at(1).role == sparsebit::InputRole::kWeight, "gamma is a weight");
  try {
    op->forward({x, at::ones({3})});
    check(false, "a gamma of the wrong length is refused");
  } catch (const sparsebit::Error& e) {
    check(std::string(e.what()).find("scale0") != std::string::npos, "the error names the node");
  }

  // mean_range over two batches: min -1 and -3, max 3 and 1, so the mean range is [-2, 2]; the
  // symmetric 8-bit scale is 2 * 2 / 255 with zero point 0.
  sparsebit::Options options("[a.observer_options]");
  sparsebit::QSpec spec;
  auto observer = plugin.observer("mean_range", spec, options);
  observer->observe(at::tensor({-1.0f, 0.5f, 3.0f}));
  observer->observe(at::tensor({-3.0f, 1.0f}));
  const sparsebit::QParams p = observer->compute();
  check(std::fabs(p.scale.item<double>() - 4.0 / 255.0) < 1e-7, "mean_range scale is 4/255");
  check(p.zero_point.item<std::int64_t>() == 0, "mean_range zero point is 0");

  options.set("min_batches", std::int64_t{0});
  check(!sparsebit::testing::thrown_message([&] { plugin.observer("mean_range", spec, options); }).empty(),
        "min_batches = 0 is refused");

  if (failures == 0) std::printf("plugin template: op, observer and registration ok\n");
  return failures == 0 ? 0 : 1;
}
