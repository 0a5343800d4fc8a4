// The plugin's entry point: one SPARSEBIT_PLUGIN per library. Registration is staged; if this
// function throws, nothing it registered is kept and the host reports the message.

#include "example.h"

namespace {
void register_all(sparsebit::Registrar& r) {
  example::register_layer_scale(r);          // op:com.example:LayerScale
  example::register_mean_range_observer(r);  // observer:mean_range
  example::register_example_npu_backend(r);  // backend:example_npu
}
}  // namespace

SPARSEBIT_PLUGIN("example.template", SPARSEBIT_PLUGIN_VERSION, register_all)
