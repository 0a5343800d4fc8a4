#pragma once
/// \file
/// QuantSlots: every quantized input of one model with its observer and quantizer, and the
/// three steps calibration is made of: observe (activations stream through their observers),
/// finish (observer result -> quantizer; weights observed here, biases derived) and apply
/// (fake quantization where it is switched on). QuantModel owns one; the layerwise runner and
/// the QDQ exporter use it through this interface.
///
/// Note [Quantization slots]
/// A slot is one quantized input of one node: (node, input index, tensor name) with its QSpec,
/// observer and quantizer. The QModule's input_specs() decide which inputs get slots; the
/// config decides the scheme; the backend's rules are checked when the model is built. Export
/// puts a Q/DQ pair on exactly the slot's edge, matched by tensor name.

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/registry.h"

namespace sparsebit {

struct SPARSEBIT_API QuantSlot {
  std::size_t node_index = 0;
  std::size_t input_index = 0;
  std::string node_name;
  std::string op_type;
  std::string tensor;
  InputRole role = InputRole::kActivation;
  bool lookup_table = false;  ///< a weight read by index (InputSpec::lookup_table)
  QSpec spec;
  std::string observer_name, quantizer_name;
  std::string observer_plugin, quantizer_plugin;  ///< where they come from, for messages
  std::unique_ptr<Observer> observer;
  std::unique_ptr<Quantizer> quantizer;
  bool calibrated = false;
  /// Ranges the observer offered (Note [Range selection]); kept from finish() until a range
  /// selection picks one, empty when it offered fewer than two.
  std::vector<RangeCandidate> range_candidates;
  std::string range;          ///< the candidate a range selection chose (empty: none ran)
  std::int64_t observed = 0;  ///< tensors observed since the last reset (activations)
  at::ScalarType observed_type = at::ScalarType::Undefined;  ///< element type of the data observed (activations)
  bool fake_fused = false;  ///< bypassed by a fuse pass: neither simulated nor exported
  bool enabled = true;      ///< switched off by the user (QuantModel::set_enabled)
  bool active() const { return enabled && !fake_fused; }
  /// The optional roles of its quantizer and observer (Note [Capabilities]), null without.
  ReconstructedByLayer* reconstructed() const { return dynamic_cast<ReconstructedByLayer*>(quantizer.get()); }
  SolvedFromInputs* solved() const { return dynamic_cast<SolvedFromInputs*>(quantizer.get()); }
  /// A weight whose integers are learnt or solved at its node (AdaRound, GPTQ), not rounded.
  bool learns_weight() const { return reconstructed() || solved(); }
  ObserverFactory make_observer;  ///< to rebuild the objects when the scheme changes
  QuantizerFactory make_quantizer;
  Options observer_options, quantizer_options;
  /// kBias slots: the node's activation and weight slots whose scales multiply to the bias
  /// scale; the bias has no observer or quantizer plugin, its parameters follow from theirs.
  int bias_activation = -1, bias_weight = -1;
  QParams bias_params;
  std::string where() const;
};

/// Why `spec` (from table `table`, "w" or "a") breaks `backend`'s rules, or nullopt: Backend::check,
/// or for a float8 spec DeploysFloat8::check_float8 (a backend without it deploys no float8).
SPARSEBIT_API std::optional<std::string> backend_rules(const Backend& backend, const QSpec& spec,
                                                       const std::string& table);

class SPARSEBIT_API QuantSlots {
 public:
  /// Makes the slots of every node of `graph` and of its control-flow bodies, numbered as the
  /// executor numbers them (Note [Flat node numbering]) (skip globs, the modules' input specs, the
  /// config's tables, biases where `backend` quantizes them). `graph`, `executor` and `backend`
  /// must outlive this object; `config` and `registry` are used until finish_building().
  QuantSlots(const Graph& graph, const Executor& executor, const Config& config, const Backend& backend,
             std::string backend_plugin, const Registry& registry);
  ~QuantSlots();
  QuantSlots(QuantSlots&&) noexcept;

  /// The view fuse passes and the backend's placement work on (valid until finish_building()).
  QuantState& state();
  /// Elements per sample of the main graph's values: how QuantState::value_elements answers.
  /// Called at most once, on the first question; an Error it throws makes every size unknown.
  void set_value_sizes(std::function<std::map<std::string, std::int64_t>()> compute);
  /// Checks the placed slots against the backend, refuses options no plugin read, and lets go
  /// of the registry.
  void finish_building();

  const std::vector<QuantSlot>& all() const { return slots_; }
  std::vector<QuantSlot>& all() { return slots_; }
  /// The slot of node `node`'s input `input` (`node` a flat number), or null.
  QuantSlot* at(std::size_t node, std::size_t input);
  const QuantSlot* at(std::size_t node, std::size_t input) const;
  /// Whether the slot is simulated and exported (a bias only while both factors of its scale are).
  bool usable(const QuantSlot& s) const;
  /// Non-bias slots whose node matches `node_glob` (and of `role`, if given).
  std::vector<QuantSlot*> matching(const std::string& node_glob, std::optional<InputRole> role);
  /// New bit width for the matching slots, checked against the backend; their objects are rebuilt.
  std::size_t set_bits(const std::string& node_glob, int bits, std::optional<InputRole> role);
  /// set_bits for one slot (not a bias): checked, objects rebuilt, to be calibrated again.
  void set_slot_bits(QuantSlot& s, int bits);
  /// Another scheme for one slot (not a bias), checked against the backend (an Error naming
  /// `what` where it refuses); objects rebuilt, to be calibrated again.
  void set_slot_spec(QuantSlot& s, const QSpec& spec, const std::string& what);

  void set_quant(bool weights, bool activations) { w_on_ = weights, a_on_ = activations; }
  bool weights_on() const { return w_on_; }
  bool activations_on() const { return a_on_; }

  /// observe: feeds an activation slot's observer (calibration). Integer data disables the slot.
  void observe(std::size_t node, std::size_t input, const at::Tensor& x);
  void reset_observers();
  /// finish: one weight or activation slot from its observer (weights are observed here).
  void finish(QuantSlot& s);
  /// finish for a bias slot: its scale from the node's activation and weight slots.
  void finish_bias(QuantSlot& s);
  /// finish for every slot of node `node`, biases last; returns its weight slot that learns by
  /// reconstruction, if any.
  QuantSlot* finish_node(std::size_t node);
  void finish_all();
  /// Gives each input the backend tied (QuantState::tie_grid) and its source one grid, the
  /// reader's (chosen for the layer that reads it), where both are calibrated activations of one
  /// per-tensor scheme; returns how many ties held. Calibration calls it last.
  std::size_t tie_grids();
  /// apply: what node `node` sees at `input`: fake-quantized where quantization is on
  /// (`force`: as if weights and activations were both on).
  at::Tensor apply(std::size_t node, std::size_t input, const at::Tensor& x, bool force = false);

 private:
  class State;
  int add(std::size_t node, std::size_t input, InputRole role, std::int64_t weight_axis);
  void add_lookup_table(std::size_t node, std::size_t input, std::int64_t row_axis);
  void add_bias_slots(std::size_t node, const std::vector<std::size_t>& bias_inputs);
  void refuse_float8_without_support(const QuantSlot& s, const char* table) const;
  const QuantTableConfig& table_for(const Node& n, bool is_weight) const;
  /// Whether `name` is a constant where flat node `node` reads it, and its current value.
  bool is_constant(std::size_t node, const std::string& name) const;
  const at::Tensor& constant(std::size_t node, const std::string& name) const;
  void probe_options(const QuantTableConfig& cfg, bool is_weight);
  void check_qparams(const QuantSlot& s, const QParams& p, const char* call) const;

  const Graph* graph_;
  const Executor* executor_;
  const Backend* backend_;
  std::string backend_name_, backend_plugin_;
  const Config* config_;      // while building (a moved QuantModel moves its config)
  const Registry* registry_;  // while building
  std::vector<QuantSlot> slots_;
  std::vector<std::vector<int>> slot_of_;                             // [node][input] -> slot index or -1
  std::set<const QuantTableConfig*> used_tables_;                     // while building
  std::unique_ptr<State> state_;                                      // while building
  std::function<std::map<std::string, std::int64_t>()> value_sizes_;  // while building
  using Input = std::pair<std::size_t, std::size_t>;                  // (flat node, input)
  std::vector<std::pair<Input, Input>> ties_;                         // reader -> source (QuantState::tie_grid)
  bool w_on_ = false, a_on_ = false;
};

}  // namespace sparsebit
