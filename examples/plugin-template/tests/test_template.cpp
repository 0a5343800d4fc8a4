// The template's own test, built from the installed SDK alone (no test framework needed): it
// registers the plugin into a recording Registrar, then checks the op and the observer against
// values computed by hand. Run with `ctest` in the build folder.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "../src/example.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

// Keeps what the plugin registers, as the host's staging registry would.
class Recorder final : public sparsebit::Registrar {
 public:
  std::map<std::string, sparsebit::OpFactory> ops;
  std::map<std::string, sparsebit::ObserverFactory> observers;
  std::map<std::string, sparsebit::BackendFactory> backends;

  void add_op_factory(const std::string& op, const std::string& domain, sparsebit::OpFactory f) override {
    ops[domain + ":" + op] = std::move(f);
  }
  void add_observer_factory(const std::string& name, sparsebit::ObserverFactory f) override {
    observers[name] = std::move(f);
  }
  void add_backend_factory(const std::string& name, sparsebit::BackendFactory f) override {
    backends[name] = std::move(f);
  }
  void add_quantizer_factory(const std::string&, sparsebit::QuantizerFactory) override {}
  void add_pass_factory(const std::string&, sparsebit::PassFactory) override {}
  void add_sparser_factory(const std::string&, sparsebit::SparserFactory) override {}
  void add_kernels_factory(const std::string&, sparsebit::KernelsFactory) override {}
};

}  // namespace

int main() {
  Recorder r;
  example::register_layer_scale(r);
  example::register_mean_range_observer(r);
  example::register_example_npu_backend(r);
  check(r.ops.count("com.example:LayerScale") == 1, "LayerScale registered in com.example");
  check(r.observers.count("mean_range") == 1, "mean_range registered");
  check(r.backends.count("example_npu") == 1, "example_npu registered");
  if (failures) return 1;

  // LayerScale: y = x * gamma along the last axis. By hand: [[1, 2], [3, 4]] * [10, -1].
  sparsebit::Graph graph;
  sparsebit::Node node;
  node.name = "scale0";
  node.op_type = "LayerScale";
  node.domain = "com.example";
  node.inputs = {"x", "gamma"};
  node.outputs = {"y"};
  auto op = r.ops["com.example:LayerScale"](sparsebit::OpContext{node, 1, graph});
  const at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2});
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
  auto observer = r.observers["mean_range"](sparsebit::ObserverContext{spec, options, "input 0 of node 'scale0'"});
  observer->observe(at::tensor({-1.0f, 0.5f, 3.0f}));
  observer->observe(at::tensor({-3.0f, 1.0f}));
  const sparsebit::QParams p = observer->compute();
  check(std::fabs(p.scale.item<double>() - 4.0 / 255.0) < 1e-7, "mean_range scale is 4/255");
  check(p.zero_point.item<std::int64_t>() == 0, "mean_range zero point is 0");

  options.set("min_batches", std::int64_t{0});
  try {
    r.observers["mean_range"](sparsebit::ObserverContext{spec, options, "input 0"});
    check(false, "min_batches = 0 is refused");
  } catch (const sparsebit::Error&) {
  }

  if (failures == 0) std::printf("plugin template: op, observer and registration ok\n");
  return failures == 0 ? 0 : 1;
}
