// One sample for steps that need shapes before any calibration: lifting's check run, pruning's
// channel analysis and MAC counts.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

std::vector<at::Tensor> sample_inputs(const Graph& graph, const DataSource& calib) {
  if (!calib.empty()) {
    auto data = calib.open(graph.inputs);
    Batcher batcher(*data, graph.inputs, 1, 1);
    auto b = batcher.next();
    if (!b) throw Error("the calibration data " + data->describe() + " yielded no samples");
    return b->inputs;
  }
  std::vector<at::Tensor> out;
  at::Generator gen = at::detail::createCPUGenerator(0);
  for (const auto& v : graph.inputs) {
    if (!v.has_shape)
      throw Error("input '" + v.name + "' has no declared shape; pass --calib so a sample fixes the shapes");
    std::vector<std::int64_t> dims;
    for (std::size_t d = 0; d < v.shape.size(); ++d) {
      if (v.shape[d].value >= 0) dims.push_back(v.shape[d].value);
      else if (d == 0) dims.push_back(1);
      else
        throw Error("input '" + v.name + "' has an unknown dimension " + std::to_string(d) +
                    "; pass --calib so a sample fixes the shapes");
    }
    if (v.elem_type == 1) out.push_back(at::randn(dims, gen));
    else if (v.elem_type == 7) out.push_back(at::zeros(dims, at::kLong));
    else if (v.elem_type == 6) out.push_back(at::zeros(dims, at::kInt));
    else
      throw Error("input '" + v.name + "' is of type " + onnx_type_name(v.elem_type) + "; pass --calib with a sample");
  }
  return out;
}

}  // namespace sparsebit
