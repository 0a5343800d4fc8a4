// Faults inside plugin objects at run time (fixture_faulty): the host's error names the plugin
// object, its plugin and the call, whatever the plugin threw.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

class PluginFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    PluginSearch s;
    s.paths = {SPARSEBIT_FIXTURE_PLUGINS};
    s.use_environment = false;
    s.disable = {"fixture.duplicate_op"};  // it would shadow a shipped op the model needs
    registry_.load(s);
  }
  Registry registry_;

  std::string error_of(const std::string& config_text, bool run_quantized) {
    try {
      QuantModel qm(load_onnx(testing::fixture_model()), Config::from_string(config_text, "faults.toml"), registry_);
      auto data = open_dataset(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", qm.graph().inputs);
      qm.calibrate(*data);
      if (run_quantized) {
        qm.set_quant(true, true);
        qm.forward({at::rand({2, 1, 28, 28})});
      }
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no sparsebit::Error for:\n" << config_text;
    return {};
  }
};

TEST_F(PluginFaults, ObserverAndQuantizerFailuresNamePluginAndCall) {
  const std::string base = "backend = \"virtual\"\n[calibration]\ncount = 16\n";
  auto msg = error_of(base + "[a]\nobserver = \"throwing_observer\"\n", false);
  EXPECT_NE(msg.find("observer 'throwing_observer' (plugin 'fixture.faulty') failed in observe: observer exploded"),
            std::string::npos)
      << msg;
  msg = error_of(base + "[a]\nobserver = \"wrong_shape_observer\"\n", false);
  EXPECT_NE(
      msg.find("observer 'wrong_shape_observer' (plugin 'fixture.faulty') compute returned 3 scales for a per-tensor"),
      std::string::npos)
      << msg;
  msg = error_of(base + "[w]\nquantizer = \"throwing_quantizer\"\n", true);
  EXPECT_NE(msg.find("quantizer 'throwing_quantizer' (plugin 'fixture.faulty') failed in forward: quantizer exploded"),
            std::string::npos)
      << msg;
  msg = error_of(base + "[a]\nquantizer = \"wrong_shape_quantizer\"\n", true);
  EXPECT_NE(msg.find("quantizer 'wrong_shape_quantizer' (plugin 'fixture.faulty') forward returned shape"),
            std::string::npos)
      << msg;
}

TEST_F(PluginFaults, PassAndOpFailuresNamePluginAndCall) {
  auto msg = error_of("[passes]\nextra = [\"throwing_pass\"]\n", false);
  EXPECT_NE(msg.find("pass 'throwing_pass' (plugin 'fixture.faulty') failed: pass exploded"), std::string::npos) << msg;

  Graph g;
  g.opset_imports[""] = 17;
  g.opset_imports["test.faulty"] = 1;
  ValueInfo x;
  x.name = "x";
  x.elem_type = 1;
  g.inputs.push_back(x);
  ValueInfo y = x;
  y.name = "y";
  g.outputs.push_back(y);
  Node n;
  n.name = "boom";
  n.op_type = "Exploding";
  n.domain = "test.faulty";
  n.inputs = {"x"};
  n.outputs = {"y"};
  g.append(n);
  Executor ex(g, registry_);
  try {
    ex.run({{"x", at::ones({2})}});
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("node 'boom' (test.faulty:Exploding) failed in plugin 'fixture.faulty'"), std::string::npos)
        << what;
    EXPECT_NE(what.find("op exploded"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace sparsebit
