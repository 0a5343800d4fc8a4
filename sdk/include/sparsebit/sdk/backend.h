#pragma once
/// \file
/// Deployment backends: the rules of a target runtime, applied at three points.
///   1. When the model is built: check() on each config table, then check_input() on every
///      quantized input (op kind, role, scheme, bits), so an undeployable config fails in seconds
///      with the node named, not at engine build time.
///   2. After the fuse passes: place() may add or bypass quantizers where the target wants Q/DQ
///      (e.g. TensorRT quantizes the skip branch of a residual Add so it can fuse the Add).
///   3. On export: quantize_bias() and min_export_opset() shape the QDQ graph, and
///      adjust_export() may rewrite it (e.g. lower a custom op to standard ONNX).

#include <cstdint>
#include <optional>
#include <string>

#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/op.h"
#include "sparsebit/sdk/pass.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

class Backend {
 public:
  virtual ~Backend() = default;
  /// One-line description for `sparsebit plugins`.
  virtual std::string description() const = 0;
  /// Why `spec` (from config table `table`, "w" or "a") is not deployable, or nullopt if it is.
  virtual std::optional<std::string> check(const QSpec& spec, const std::string& table) const = 0;
  /// Why quantizing input `input` of `node` (with `role` and `spec`) is not deployable.
  virtual std::optional<std::string> check_input(const Node& node, std::size_t input, InputRole role,
                                                 const QSpec& spec) const {
    (void)node, (void)input, (void)role, (void)spec;
    return std::nullopt;
  }
  /// Adjusts which inputs are quantized, after the fuse passes.
  virtual void place(QuantState& state) const { (void)state; }
  /// Whether biases (InputRole::kBias) are int32 at scale s_act * s_weight in deployment.
  virtual bool quantize_bias() const { return false; }
  /// Lowest default-domain opset the exported model may have.
  virtual std::int64_t min_export_opset() const { return 13; }
  /// Rewrites the exported QDQ graph in place (after Q/DQ insertion, before validation).
  virtual void adjust_export(Graph& graph) const { (void)graph; }
  /// Whether the exported model is meant for runtimes whose x86 integer kernels add u8 x s8
  /// products in pairs in 16 bits (ONNX Runtime without VNNI): the exporter then checks the
  /// exported weights and warns about layers that can saturate (Note [u8s8 saturation]).
  virtual bool checks_u8s8_saturation() const { return false; }
};

/// A backend that deploys float8 tensors (Note [Float8 elements] in quant.h) also derives from
/// this (Note [Capabilities] in quantizer.h); the host refuses float8 tables for any other. Its
/// place() decides where float8 inputs stay quantized (QuantState::input_spec tells them apart).
class DeploysFloat8 {
 public:
  virtual ~DeploysFloat8() = default;
  /// Why the float8 `spec` (from table `table`, "w" or "a") is not deployable, or nullopt; asked
  /// instead of Backend::check for float8 specs.
  virtual std::optional<std::string> check_float8(const QSpec& spec, const std::string& table) const = 0;
};

}  // namespace sparsebit
