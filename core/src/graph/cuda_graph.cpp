// CUDA graphs for the training step (Note [CUDA graph steps] in cuda_graph.h).

#include "graph/cuda_graph.h"

#include <optional>

#include "sparsebit/sdk/error.h"

#ifdef SPARSEBIT_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace sparsebit::detail {

#ifdef SPARSEBIT_CUDA_GRAPHS

bool cuda_graphs_supported() { return true; }

struct CaptureStream::Impl {
  c10::cuda::CUDAStream previous, side;
  c10::cuda::CUDAStreamGuard guard;
  Impl(c10::cuda::CUDAStream p, c10::cuda::CUDAStream s) : previous(p), side(s), guard(s) {}
};

CaptureStream::CaptureStream(const at::Device& device) {
  if (!device.is_cuda()) return;
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto previous = c10::cuda::getCurrentCUDAStream(index);
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  at::cuda::CUDAEvent queued;
  queued.record(previous);
  queued.block(side);
  impl_ = std::make_unique<Impl>(previous, side);
}

CaptureStream::~CaptureStream() {
  if (!impl_) return;
  at::cuda::CUDAEvent done;
  done.record(impl_->side);
  done.block(impl_->previous);
}

struct StepGraph::Impl {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::recorded() const { return impl_->graph != nullptr; }

void StepGraph::replay() {
  if (!impl_->graph) throw Error("internal: replay of a CUDA graph that was not recorded");
  impl_->graph->replay();
}

std::string StepGraph::record(const std::function<void()>& body) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  // As PyTorch's capture does: nothing queued before may still be running.
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    throw Error(std::string("CUDA: ") + cudaGetErrorString(e) + " before recording a graph");
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  try {
    graph->capture_begin();
    body();
    graph->capture_end();
    impl_->graph = std::move(graph);
    return "";
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (const auto eol = why.find('\n'); eol != std::string::npos) why.resize(eol);
    // End a capture the failure left open (capture_end ends it even when it throws).
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      try {
        graph->capture_end();
      } catch (const std::exception&) {
      }
      if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
        cudaGraph_t partial = nullptr;
        if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
      }
    }
    (void)cudaGetLastError();  // the capture's error is not the next operation's
    return why;
  }
}

#else  // no CUDA in this LibTorch: cuda_graphs_supported() is false and callers stop there

bool cuda_graphs_supported() { return false; }
struct CaptureStream::Impl {};
CaptureStream::CaptureStream(const at::Device& device) {
  if (device.is_cuda()) throw Error("internal: CUDA stream in a build without CUDA");
}
CaptureStream::~CaptureStream() = default;
struct StepGraph::Impl {};
StepGraph::StepGraph() = default;
StepGraph::~StepGraph() = default;
bool StepGraph::recorded() const { return false; }
void StepGraph::replay() { throw Error("internal: CUDA graphs in a build without CUDA"); }
std::string StepGraph::record(const std::function<void()>&) { return "this build has no CUDA"; }

#endif

}  // namespace sparsebit::detail
