#pragma once
/// \file
/// Graph passes. A pass runs at one of three stages of the pipeline:
///   - kSimplify, before conversion: rewrites the IR (Graph) and keeps its float function;
///   - kFuse, after conversion: sees which node inputs are quantized (QuantState) and may
///     bypass quantizers that deployment fuses away ("fake fused": kept, neither applied in
///     simulation nor exported);
///   - kLayer, during layerwise calibration: called for each node once its quantizers are set,
///     with the node's float and quantized outputs on the calibration data (LayerState), e.g.
///     to correct its bias. Needs `[calibration] mode = "layerwise"` or `"asym"`.
/// A pass registered with a PassSchedule has a place in the default schedule; `[schedule]` in
/// the config turns passes on or off by name, `[passes]` orders them and sets their options
/// (Note [Pass schedule] in sparsebit/core/passes.h). Passes that match subgraphs use
/// sparsebit/sdk/pattern.h.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/sdk/export.h"
#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/options.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

struct PassContext {
  const Options& options;
  /// Runs one node with the loaded op plugins (for constant folding); empty where the host
  /// offers none. Throws sparsebit::Error when no plugin runs the op.
  std::function<std::vector<at::Tensor>(const Node&, const std::vector<at::Tensor>&)> evaluate = {};
  /// Calibration statistics for simplify passes that move ranges between activations and
  /// weights (smooth_quant): for each (value name, channel axis; negative counts from the end),
  /// the largest |x| of each channel of that float value over the calibration samples, as a 1-D
  /// float tensor, all requests served by one pass over the data. Empty where the host has no
  /// calibration data (`sparsebit simplify`); the pass should then say what it needs.
  using ChannelRequest = std::pair<std::string, std::int64_t>;
  std::function<std::vector<at::Tensor>(const std::vector<ChannelRequest>&)> channel_absmax = {};
  /// Second moments for passes that choose a weight transform by the output error it causes
  /// (awq): for each request, over every position of the float value on the calibration
  /// samples (the channel axis moved last, the rest flattened into n rows x), the mean |x| of
  /// each channel [C] and the Gram matrix (1/n) sum x x^T [C, C], float32. One pass over the
  /// data serves all requests; the caller bounds memory by asking for a few values at a time.
  /// The tensors are on the device the host calibrates on (`--device`; the graph's weights stay
  /// on the host), so a pass can search on the GPU. Empty where the host has no calibration data.
  struct ChannelMoments {
    at::Tensor mean_abs;
    at::Tensor gram;
    std::int64_t rows = 0;
  };
  std::function<std::vector<ChannelMoments>(const std::vector<ChannelRequest>&)> channel_moments = {};
  /// The grid the configuration gives constant input `input` of `node` ([w] or its [[specific]]
  /// entry; skip applied), `channel_axis` being the weight's output-channel axis: its QSpec
  /// (bits, scheme, group size and axis) and `round`, which rounds a candidate value of that
  /// weight to nearest as calibration will (the configured observer's range) and returns it
  /// dequantized. std::nullopt where that input stays float. Empty where the host has no
  /// quantization config (`sparsebit simplify`).
  struct WeightGrid {
    QSpec spec;
    std::function<at::Tensor(const at::Tensor&)> round;
  };
  std::function<std::optional<WeightGrid>(const Node&, std::size_t, std::int64_t)> weight_grid = {};
};

/// Tells the host that the pass running on this thread is done with initializer `name` of
/// `graph` for now, so that the host may give its memory back: a weight mapped from the model's
/// files is dropped from memory and read again when used, and one the pass wrote may move to a
/// file of the host's; the value stays the same. A pass that reads or writes the weights of a
/// large model layer by layer calls it after each layer. Does nothing where the host set no
/// handler (SDK 1.7; a free function, so that PassContext keeps the size plugins built against
/// 1.0 know).
SPARSEBIT_API void release_initializer(Graph& graph, const std::string& name);

/// For hosts: the handler release_initializer calls on this thread while the returned guard
/// lives (the previous one afterwards); an empty function sets none (SDK 1.7).
class SPARSEBIT_API ReleaseHandler {
 public:
  explicit ReleaseHandler(std::function<void(Graph&, const std::string&)> handler);
  ~ReleaseHandler();
  ReleaseHandler(const ReleaseHandler&) = delete;
  ReleaseHandler& operator=(const ReleaseHandler&) = delete;

 private:
  std::function<void(Graph&, const std::string&)> previous_;
};

/// The quantization state a kFuse pass works on.
class QuantState {
 public:
  virtual ~QuantState() = default;
  virtual const Graph& graph() const = 0;
  /// True if input `input` of `node` has a quantizer that is not bypassed.
  virtual bool is_quantized(const Node& node, std::size_t input) const = 0;
  /// Bypasses (or restores) that quantizer; no-op if the input has none.
  virtual void set_fake_fused(const Node& node, std::size_t input, bool fused) = 0;
  /// Quantizes activation input `input` of `node` with the [a] scheme if it is not already;
  /// returns false when that is impossible (a constant, an omitted input, a skipped node).
  virtual bool quantize_activation(const Node& node, std::size_t input) = 0;
  /// The scheme of input `input` of `node`'s quantizer (bypassed or not), or nullptr if it has none
  /// (SDK 1.2).
  virtual const QSpec* input_spec(const Node& node, std::size_t input) const {
    (void)node, (void)input;
    return nullptr;
  }
  /// Elements of value `value` of the main graph for one sample, as the float model computes it
  /// on the first calibration sample (run once, on the first call); -1 where that is unknown (no
  /// calibration data, a value inside a control-flow body, a run that failed) (SDK 1.3).
  virtual std::int64_t value_elements(const std::string& value) const {
    (void)value;
    return -1;
  }
  /// Asks that activation input `input` of `node` and activation input `source_input` of
  /// `source` share one grid (scale and zero point) once calibrated, the reader's: for an input
  /// that reads the output of an op that only moves data (MaxPool, Reshape, Transpose, ...)
  /// whose input is `source`'s, so that a runtime that drops a DequantizeLinear/QuantizeLinear
  /// pair of one grid around such an op runs it on the integers. Ignored where the two schemes
  /// differ or either input is not quantized when calibration ends (SDK 1.4).
  virtual void tie_grid(const Node& node, std::size_t input, const Node& source, std::size_t source_input) {
    (void)node, (void)input, (void)source, (void)source_input;
  }
};

/// One node of the layerwise calibration runner (Note [Layerwise runner] in quant_model.h).
class LayerState {
 public:
  virtual ~LayerState() = default;
  virtual const Graph& graph() const = 0;
  virtual const Node& node() const = 0;
  /// Number of cached calibration batches.
  virtual std::size_t batches() const = 0;
  /// Output `k` of the node in the float model for batch `b`.
  virtual at::Tensor float_output(std::size_t b, std::size_t k = 0) const = 0;
  /// Output `k` of the node with its quantizers on, for batch `b`, computed now from the
  /// inputs the quantized model gives it ("asym" mode) or the float ones ("layerwise").
  virtual at::Tensor quantized_output(std::size_t b, std::size_t k = 0) = 0;
  /// Index of the node's bias input (a 1-D constant), or -1 when it has none.
  virtual int bias_input() const = 0;
  /// Axis of output 0 that the bias runs along (1 for Conv, the last for Gemm/MatMul).
  virtual std::int64_t bias_axis() const = 0;
  /// Replaces the value of the bias (same shape); used by the rest of calibration and export.
  virtual void set_bias(const at::Tensor& value) = 0;
};

/// Where a pass stands in the default schedule, registered with it (Registrar::add_pass). Since
/// SDK 1.6; a pass registered without one runs only when the config turns it on.
struct PassSchedule {
  /// Position among the passes of its stage: lower runs first, equal orders by name. The shipped
  /// passes use 100 to 2100 in steps of 100, so a vendor's pass can go between any two.
  int order = 0;
  /// Whether it runs when the config does not say.
  bool on_by_default = false;
  /// Backends (the config's `backend`) for which on_by_default holds; empty: every backend. For
  /// the others the pass is off unless the config turns it on.
  std::vector<std::string> backends;
};

class Pass {
 public:
  enum class Stage { kSimplify, kFuse, kLayer };
  virtual ~Pass() = default;
  virtual Stage stage() const = 0;
  /// kSimplify passes: rewrite `graph`; return true if it changed.
  virtual bool run(Graph& graph, const PassContext& ctx) {
    (void)graph;
    (void)ctx;
    return false;
  }
  /// kFuse passes: adjust quantizers; return true if anything changed.
  virtual bool run_quant(QuantState& state, const PassContext& ctx) {
    (void)state;
    (void)ctx;
    return false;
  }
  /// kLayer passes: called once per node; return true if anything changed.
  virtual bool run_layer(LayerState& state, const PassContext& ctx) {
    (void)state;
    (void)ctx;
    return false;
  }
};

}  // namespace sparsebit
