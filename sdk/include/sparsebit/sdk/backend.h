#pragma once
/// \file
/// Deployment backends: the rules of a target runtime on schemes and bit widths, checked when
/// the config is loaded (not when the engine is built), and the export settings it needs.

#include <cstdint>
#include <optional>
#include <string>

#include "sparsebit/sdk/quant.h"

namespace sparsebit {

class Backend {
 public:
  virtual ~Backend() = default;
  /// One-line description for `sparsebit plugins`.
  virtual std::string description() const = 0;
  /// Why `spec` (from config table `table`, "w" or "a") is not deployable, or nullopt if it is.
  virtual std::optional<std::string> check(const QSpec& spec, const std::string& table) const = 0;
  /// Whether biases (InputRole::kBias) are int32 at scale s_act * s_weight in deployment.
  virtual bool quantize_bias() const { return false; }
  /// Lowest default-domain opset the exported model may have.
  virtual std::int64_t min_export_opset() const { return 13; }
};

}  // namespace sparsebit
