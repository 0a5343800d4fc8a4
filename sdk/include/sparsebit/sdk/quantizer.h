#pragma once
/// \file
/// A quantizer owns the parameters of one quantized tensor and applies fake quantization in
/// the forward pass. It is initialised from an observer's result and may learn afterwards
/// (LSQ, PACT): parameters() returns the tensors an optimizer should update.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "sparsebit/sdk/options.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

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

}  // namespace sparsebit
