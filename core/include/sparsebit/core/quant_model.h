#pragma once
/// \file
/// QuantModel: a model with its quantizers, as a Session builds it (Note [Session]: the steps
/// before it, pruning and BatchNorm re-estimation, and the calibration after it).
///
///     sparsebit::Session session(config);
///     sparsebit::QuantModel qm = session.quant_model(session.load("model.onnx", calib), calib);
///     session.calibrate(qm, calib);          // observers -> quantizer parameters
///     qm.set_quant(true, true);
///     auto outputs = qm.forward({x});        // simulated low-bit, differentiable
///     qm.export_onnx("model_qdq.onnx");      // QDQ ONNX for ONNX Runtime / TensorRT
///
/// Note [Layerwise runner]
/// `[calibration] mode` picks how data flows. "streaming": one batch at a time through the
/// whole graph, observers stream (memory independent of the sample count). "layerwise": every
/// batch is cached at the graph inputs and the graph runs node by node over all batches, each
/// node's quantizers set as soon as it has seen all the data. "asym": as layerwise, with a
/// second, quantized stream beside the float one: each node's activation observers see the
/// quantized stream (what the deployed model feeds it) and its output is computed twice, float
/// from float inputs and quantized from quantized inputs. Both caches release values by the
/// out-degree rule (Note [Release by out-degree]); where the quantized stream has not diverged
/// yet it shares the float stream's tensors instead of holding copies.
///
/// Note [Layer reconstruction]
/// A weight quantizer that is ReconstructedByLayer (AdaRound) is trained at its node by the
/// layerwise runner: targets are the node's float outputs; inputs are the cached inputs (the
/// quantized stream in asym mode), fake-quantized by the node's activation quantizers; each
/// step draws `batch_size` samples, runs the node with the quantizer's soft weight, and takes
/// an Adam step on the quantizer's parameters() against
///     mean over samples/positions of sum over channels (y - y_float)^2 + penalty(step).
/// kLayer passes (bias correction) run after it, on the final weights.
///
/// Note [Recorded reconstruction steps]
/// A layer's thousands of steps are each a few dozen small operators: on a GPU the host's
/// dispatch, not the GPU, sets their pace. So on a GPU the samples of every step are drawn on
/// the host a chunk of steps ahead (the same draws, in the same order) and copied there once per
/// chunk; Adam counts its steps there and the penalty reads its step from a tensor there
/// (PenaltyOnDevice, sdk/quantizer.h): no step waits for the GPU. With
/// `[calibration] cuda_graph = true` (the default) the step (the inputs' fake quantization, the soft weight,
/// the node, the loss and penalty, backward and Adam) is recorded as a CUDA graph after three
/// eager ones, and each later step gathers its samples into the recorded inputs and replays it:
/// the same arithmetic as the eager steps. Steps whose samples have another shape (a short
/// batch) run eagerly; a step that cannot be recorded (an operator that reads a value on the
/// host) leaves the layer eager, with a warning. Runs over several processes stay eager (their
/// gradients are summed on the host's schedule). Layers are reconstructed one after the other,
/// not batched together: in asym mode a layer's inputs depend on the layers before it.
///
/// Note [QAT]
/// init_qat() replaces the executor's copies of the weights and biases of every node with an
/// active weight quantizer by leaf tensors that require gradients; the graph's initializers
/// keep the float originals until export, which writes the executor's (trained) values. Weight
/// quantizers see the trained weight at every forward (their scale learns where they are
/// learnable); gradients cross rounding by each quantizer's rule (STE, LSQ, PACT, ...).
/// BatchNormalization is folded into its conv by fuse_bn before conversion by default, so the
/// trained weights carry it; with `fuse_bn = false` it stays, its scale and bias train, train()
/// makes it use batch statistics and update its running ones, and export folds it.

#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/bit_allocation.h"
#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/opset_lift.h"
#include "sparsebit/core/quant_slots.h"
#include "sparsebit/core/registry.h"

namespace sparsebit {

/// One layer's reconstruction (Note [Layer reconstruction]): the mean squared error of its
/// output against the float layer's, over the cached calibration data, with the weight rounded
/// to nearest and with the learnt rounding (inputs as the runner feeds them).
struct ReconstructionReport {
  std::string node;
  std::string quantizer;  ///< adaround, gptq, ...; iterations is 0 for weights solved from inputs
  double mse_nearest = 0, mse_learnt = 0;
  std::int64_t iterations = 0;
  std::int64_t recorded_steps = 0;  ///< of `iterations`, replayed from a CUDA graph
  double seconds = 0;
};

struct CalibrationStats {
  std::int64_t samples = 0;
  std::int64_t batches = 0;
  double seconds = 0;
  double parameter_seconds = 0;  ///< of `seconds`, computing scales and zero points (streaming mode)
  std::string mode;
  std::size_t peak_cached_tensors = 0;  ///< layerwise/asym: most per-batch tensors cached at once
  std::int64_t peak_cached_bytes = 0;   ///< layerwise/asym: most bytes cached at once
  std::vector<ReconstructionReport> reconstructions;
  std::vector<std::string> layer_pass_changes;  ///< "pass: node" for every node a kLayer pass changed
  /// Note [Choosing ranges by the consuming layer]: inputs that chose, on how many samples, in
  /// how long (part of `seconds`), and how many took each candidate.
  std::size_t range_selected_inputs = 0;
  std::int64_t range_selection_samples = 0;
  double range_selection_seconds = 0;
  std::map<std::string, std::size_t> range_choices;
  /// Note [Choices judged at the output]: held-out samples, inputs whose layer preferred another
  /// range than their observer's own and how many kept it, and the output error (relative, mean
  /// over those samples) with the observers' own ranges and as kept.
  std::int64_t range_judged_samples = 0;
  std::size_t range_departures = 0, range_kept_departures = 0;
  double range_output_error_default = 0, range_output_error_kept = 0;
};

/// One quantized input in the report: where, the scheme, and the parameters once calibrated.
struct SlotReport {
  std::string node, op_type, tensor;
  std::size_t input_index = 0;
  InputRole role = InputRole::kActivation;
  std::string scheme;  ///< QSpec::qscheme()
  int bits = 8;
  std::int64_t qmin = 0, qmax = 255;  ///< the integer grid (QSpec::qmin, qmax)
  std::optional<std::int64_t> axis;   ///< per-channel axis
  std::string observer, quantizer;
  std::string range;  ///< the observer's candidate a range selection chose (empty: none ran)
  bool calibrated = false, fake_fused = false, enabled = true;
  std::vector<double> scale, zero_point;  ///< empty until calibrated
};

/// QuantModel::report(): the model, backend and every quantized input.
struct QuantizationReport {
  std::string model;  ///< source path
  std::int64_t source_opset = 0;
  std::string backend, config;  ///< backend name, config source
  std::size_t nodes = 0;
  std::vector<SlotReport> slots;
  std::optional<BitAllocation> bit_allocation;  ///< set when [bit_allocation] chose the widths
  std::optional<CalibrationStats> calibration;
};

/// The report as JSON text (the "quantized_inputs" and "calibration" of `sparsebit quantize --report`).
SPARSEBIT_API std::string quantization_report_json(const QuantizationReport& report);

/// The QuantizeLinear and DequantizeLinear nodes of `g` (not of its subgraphs): a model with any
/// is already quantized.
SPARSEBIT_API std::size_t count_qdq_nodes(const Graph& g);

/// Called after each calibration batch (samples done so far, total if known or -1).
using ProgressFn = std::function<void(std::int64_t done, std::int64_t total)>;

struct LayerPass;

class SPARSEBIT_API QuantModel {
 public:
  /// `calibration`, when given, serves the simplify passes' calibration statistics
  /// (PassContext::channel_absmax: smooth_quant needs them).
  QuantModel(Model model, Config config, const Registry& registry, const DataSource& calibration = {});
  ~QuantModel();
  QuantModel(QuantModel&&) noexcept;
  QuantModel& operator=(QuantModel&&) noexcept;

  /// Runs calibration over `data` (config's batch size, count and mode) and initialises every
  /// quantizer from its observer.
  CalibrationStats calibrate(Dataset& data, const ProgressFn& progress = {});

  /// Quantization-aware training (Note [QAT]): calibrates on `data`, turns weight and
  /// activation quantization on, and makes the float weights and biases of quantized nodes
  /// trainable. Train parameters() with any LibTorch optimizer through forward(); export
  /// writes the trained values.
  CalibrationStats init_qat(Dataset& data, const ProgressFn& progress = {});
  /// The same from the calibration already done (calibrate() first, as the original toolkit's
  /// calibrate() then init_QAT()); an Error before any calibration.
  void init_qat();
  /// Every trainable tensor after init_qat(), named ("weight NAME" for the model's float
  /// constants, "quantizer NODE#INPUT/k" for quantizer parameters), in a fixed order.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters();
  std::vector<at::Tensor> parameters();
  /// Constants that training updates in place (BatchNormalization's running statistics), named
  /// "state NAME"; QAT checkpoints save them with the parameters.
  std::vector<std::pair<std::string, at::Tensor>> named_states() const;
  /// Training mode (init_qat() turns it on): BatchNormalization normalizes with batch statistics
  /// and updates its running ones; eval() uses the running ones. Export folds each
  /// BatchNormalization into the convolution before it (Note [BN folding at export]).
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  /// Turns weight / activation fake quantization on or off (both off after construction).
  void set_quant(bool weights, bool activations);
  /// Switches the quantizers of nodes whose name matches `node_glob` (of `role`, or all roles)
  /// on or off; a disabled quantizer is neither simulated nor exported. Returns how many.
  std::size_t set_enabled(const std::string& node_glob, bool enabled, std::optional<InputRole> role = {});
  /// Changes the bit width of matching quantizers (checked against the backend). Their
  /// observers and quantizers are rebuilt: calibrate again before using them.
  std::size_t set_bits(const std::string& node_glob, int bits, std::optional<InputRole> role = {});

  /// Chooses per-input bit widths under the config's [bit_allocation] budgets by measured
  /// sensitivity (Note [Bit allocation]) on `calib`, and sets them: calibrate() next. The
  /// command and the Python package do this before calibrating when the table is there.
  const BitAllocation& allocate_bits(const DataSource& calib, const ProgressFn& progress = {});
  const std::optional<BitAllocation>& bit_allocation() const { return bit_allocation_; }

  /// Called with every tensor a node reads (by name), before its quantizer applies.
  using ValueFn = std::function<void(const std::string& tensor, const at::Tensor& value)>;
  /// Runs the model (graph inputs in order) and returns the graph outputs.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs, const ValueFn& on_value = {});
  /// Switches one quantizer (an index into slots()) on or off.
  void set_slot_enabled(std::size_t slot, bool enabled);

  /// Writes the QDQ ONNX model atomically; every slot must be calibrated.
  void export_onnx(const std::string& path) const;
  /// The QDQ graph export would write (for inspection and tests).
  Graph export_graph() const;
  /// The exported model's bytes (graph plus metadata such as sparsebit.bits). With `external`,
  /// large initializers go there instead (ONNX external data at `external_location`, relative to
  /// the model) when `force_external` or the model would approach protobuf's 2 GiB limit.
  std::string serialize(std::string* external = nullptr, const std::string& external_location = "",
                        bool force_external = false) const;

  /// The report: model, config, backend and every slot with its parameters (and `stats`).
  QuantizationReport report(const CalibrationStats* stats = nullptr) const;
  /// report() as JSON text.
  std::string report_json(const CalibrationStats* stats = nullptr) const;

  const Graph& graph() const { return model_->graph; }
  /// The traits of the ops of the registry the model was built with (Note [Op traits]).
  const OpTraitTable& op_traits() const { return ops_; }
  const ModelMeta& meta() const { return model_->meta; }
  const Config& config() const { return config_; }
  const std::vector<QuantSlot>& slots() const { return slots_->all(); }
  Executor& executor() { return *executor_; }

 private:
  // The calibration runners, the accuracy target and the layer passes reach the slots through
  // quant/quant_model_access.h, inside the core.
  friend struct QuantModelAccess;
  /// Replaces constant input `input` of node `node` (graph and executor) by `value` of the same
  /// shape; where other nodes read the same constant, this node gets its own copy (and its
  /// slot follows the new name).
  void set_constant_input(std::size_t node, std::size_t input, const at::Tensor& value);

  std::unique_ptr<Model> model_;  // heap-held: the executor refers to its graph
  Config config_;
  OpTraitTable ops_;  // asked again at export (lifting to 21 for 4-bit Q/DQ), when the registry may be gone
  std::unique_ptr<Backend> backend_;
  std::string backend_plugin_;
  std::unique_ptr<Executor> executor_;
  std::vector<LayerPass> layer_passes_;  // kLayer passes, called by the layerwise runner
  std::unique_ptr<QuantSlots> slots_;
  bool training_ = false;
  std::optional<BitAllocation> bit_allocation_;
  std::vector<std::string> trainable_;  // float constants made trainable by init_qat, in node order
};

}  // namespace sparsebit
