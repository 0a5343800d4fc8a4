#pragma once
// Declarations shared by the template's source files; plugin.cpp registers them.

#include <sparsebit/sdk/plugin.h>

namespace example {

void register_layer_scale(sparsebit::Registrar& r);
void register_mean_range_observer(sparsebit::Registrar& r);
void register_example_npu_backend(sparsebit::Registrar& r);

}  // namespace example
