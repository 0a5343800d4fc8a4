#pragma once
/// \file
/// A quantizer owns the parameters of one quantized tensor and applies fake quantization in
/// the forward pass. It is initialised from an observer's result and may learn afterwards
/// (LSQ, PACT): parameters() returns the tensors an optimizer should update.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/sdk/options.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

/// How the calibration runner optimises a quantizer that learns from its layer's output
/// (Note [Layer reconstruction] in sparsebit/core/quant_model.h).
struct ReconstructionSettings {
  std::int64_t iterations = 20000;
  std::int64_t batch_size = 32;  ///< samples per step, drawn from the cached calibration data
  double learning_rate = 1e-3;   ///< Adam
  std::uint64_t seed = 0;        ///< for drawing the samples
};

struct QuantizerContext {
  QSpec spec;
  const Options& options;
  std::string where;
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  /// Takes the observer's result as the starting parameters.
  virtual void initialize(const QParams& observed) = 0;
  /// Fake-quantized x; differentiable with respect to x (and learnable parameters).
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  /// Current parameters, used for export (must be per Note [Quantization arithmetic]).
  virtual QParams qparams() const = 0;
  virtual std::vector<at::Tensor> parameters() { return {}; }
  /// False when the quantizer's grid is not an integer affine grid that QuantizeLinear can
  /// express (DoReFa): its weights are then exported as the float values forward() produces,
  /// and its activations cannot be exported.
  virtual bool affine_grid() const { return true; }
};

/// Note [Capabilities]
/// A quantizer or observer takes an optional role by deriving from that role's interface as
/// well as from Quantizer or Observer (`class AdaRound : public Quantizer, public
/// ReconstructedByLayer`); the host finds the role with dynamic_cast when it needs it. Within
/// a major SDK version an interface, once released, never changes: a new role, or a new
/// method of an old one, comes as a new interface in a new minor version, so a plugin built
/// against an older minor still loads, and simply has none of the newer roles
/// (docs/PLUGINS.md, Stability). A factory that decides per instance returns a class with or
/// without the interface (the rtn quantizer searches clipping only when asked).

/// A weight quantizer that learns by layer reconstruction (AdaRound). The layerwise runner calls
/// begin_reconstruction(weight), minimises the layer's output error plus
/// reconstruction_penalty(step) over parameters() with Adam for settings().iterations steps,
/// and calls end_reconstruction(), after which forward() must be deterministic and on the grid
/// of qparams() (export stores the integers of forward(weight)).
class ReconstructedByLayer {
 public:
  virtual ~ReconstructedByLayer() = default;
  virtual ReconstructionSettings settings() const = 0;
  virtual void begin_reconstruction(const at::Tensor& weight) = 0;
  /// A scalar added to the layer's loss at `step` (0-based); undefined for none.
  virtual at::Tensor reconstruction_penalty(std::int64_t step) = 0;
  virtual void end_reconstruction() = 0;
};

/// A ReconstructedByLayer quantizer whose penalty can take the step as a 0-dim int64 tensor on
/// the weight's device, computed without reading it on the host, so that a reconstruction step
/// recorded as a CUDA graph replays it (Note [Recorded reconstruction steps] in
/// sparsebit/core/quant_model.h). On GPUs the runner uses it whenever it is there, recorded
/// or not; without it the steps run eagerly with reconstruction_penalty(). An undefined
/// tensor means no penalty.
class PenaltyOnDevice {
 public:
  virtual ~PenaltyOnDevice() = default;
  virtual at::Tensor reconstruction_penalty_on_device(const at::Tensor& step) = 0;
};

/// Note [Weights solved from layer inputs]
/// A weight quantizer that computes its weight from the statistics of the layer's inputs
/// (GPTQ). In a layerwise calibration mode the runner calls accumulate_inputs(rows) once per
/// cached batch, rows [n, K] being the layer's data input as the quantized model gives it
/// ("asym") or the float model ("layerwise"), one row per input vector, its K columns running
/// along the weight's reduction axis; then solve(weight, reduction_axis). Afterwards forward()
/// must be deterministic and on the grid of qparams() (export stores the integers of
/// forward(weight)). Layers whose reduction the runner cannot lay out as rows (today: anything
/// but MatMul and Gemm) are rounded to nearest, with a warning.
class SolvedFromInputs {
 public:
  virtual ~SolvedFromInputs() = default;
  virtual void accumulate_inputs(const at::Tensor& rows) = 0;
  virtual void solve(const at::Tensor& weight, std::int64_t reduction_axis) = 0;
};

/// A SolvedFromInputs quantizer in a run spread over several processes (Note [Distributed
/// observers] in observer.h): input_state() is what accumulate_inputs() gathered, as tensors
/// that add up over the data (a Hessian times its sample count, and the count), the same
/// shapes in every process (on the device of the layer's inputs); the runner sums them over the
/// processes (NCCL on GPUs) and merge_inputs() replaces the statistics by that sum, so every
/// process solves from the statistics of all the data and all get the same weight. Without
/// this interface the quantizer sees every batch in every process.
class MergesInputs {
 public:
  virtual ~MergesInputs() = default;
  virtual std::vector<at::Tensor> input_state() const = 0;
  virtual void merge_inputs(const std::vector<at::Tensor>& sums) = 0;
};

}  // namespace sparsebit
