#pragma once
// ONNX's own code (shape inference, the version converter, the checker) run on a copy of a model
// in a child process.

#include <onnx/onnx_pb.h>

#include <functional>
#include <string>

namespace sparsebit {

/// Runs `work` on a copy of `proto` in a forked child process and returns what it made of it:
/// on malformed models ONNX's own code can crash (e.g. ConvTranspose shape inference on a
/// rank-2 input segfaults in ONNX 1.12), and a crash there must not take the host down.
/// Result: "1" + the serialized model, "0" + an error message, or "" after a crash, with
/// `status` the child's wait status.
std::string run_isolated(const onnx::ModelProto& proto, const std::function<onnx::ModelProto(onnx::ModelProto&)>& work,
                         int& status);

}  // namespace sparsebit
