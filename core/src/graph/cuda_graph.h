#pragma once
// CUDA graphs for the training step (Note [CUDA graph steps]). Built against a LibTorch with
// CUDA (SPARSEBIT_CUDA_GRAPHS); elsewhere supported() is false and nothing else may be called.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>

namespace sparsebit::detail {

/// Note [CUDA graph steps]
/// With [qat] cuda_graph = true on a GPU, a training step is recorded once and replayed: the
/// teacher's forward into fixed target tensors, then the student's forward, the loss, backward
/// and FusedAdam on fixed input tensors. A replay queues the whole step with one launch, so none
/// of the ~2,300 (ResNet-18) to ~5,500 (ResNet-50) ATen operators is dispatched by the host per
/// step. On a GPU, Adam counts its steps there from the first step, so eager and recorded steps
/// do the same arithmetic. As in PyTorch's whole-network capture, the first steps run eagerly on
/// the stream the graphs are recorded on (libraries allocate their workspaces, cuDNN picks its
/// algorithms, Adam creates its state); a step is recorded when its inputs have the shape of the
/// first recorded one, other shapes (a short last batch) run eagerly. Recording fails when an
/// operator synchronizes with the host (reads a value on the GPU, copies from pageable memory):
/// the recorded work has not run, so that step and all later ones run eagerly, after a warning
/// naming the reason. Single-process runs only (a distributed step's gradient sums wait on the
/// host).

/// True where this build can record CUDA graphs.
bool cuda_graphs_supported();

/// While alive, work on `device` goes to a stream of its own (graphs cannot be recorded on the
/// default stream), which first waits for the work queued before; at the end the previous
/// stream waits for it. Does nothing for a CPU device.
class CaptureStream {
 public:
  explicit CaptureStream(const at::Device& device);
  ~CaptureStream();
  CaptureStream(const CaptureStream&) = delete;
  CaptureStream& operator=(const CaptureStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One recorded piece of work, replayed on the current stream.
class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  /// Records what `body` queues on the current stream (a CaptureStream's). Returns "" on
  /// success, else why it failed; `body`'s queued work has then not run and no graph is kept.
  std::string record(const std::function<void()>& body);
  bool recorded() const;
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparsebit::detail
