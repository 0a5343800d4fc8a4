// QuantSlots at work: finding slots, setting their bits and specs, quantizing and observing
// through them, and finishing them into parameters (quant_slots.cpp builds them).

#include <ATen/ATen.h>

#include <map>
#include <optional>

#include "base/glob.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "quant/plugin_call.h"
#include "sparsebit/core/quant_slots.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

QuantSlot* QuantSlots::at(std::size_t node, std::size_t input) {
  return const_cast<QuantSlot*>(static_cast<const QuantSlots*>(this)->at(node, input));
}

const QuantSlot* QuantSlots::at(std::size_t node, std::size_t input) const {
  if (node >= slot_of_.size() || input >= slot_of_[node].size() || slot_of_[node][input] < 0) return nullptr;
  return &slots_[static_cast<std::size_t>(slot_of_[node][input])];
}

bool QuantSlots::usable(const QuantSlot& s) const {
  if (!s.active()) return false;
  if (s.role != InputRole::kBias) return true;
  // A bias is int32 only while both factors of its scale are quantized.
  return slots_[static_cast<std::size_t>(s.bias_activation)].active() &&
         slots_[static_cast<std::size_t>(s.bias_weight)].active();
}

std::vector<QuantSlot*> QuantSlots::matching(const std::string& node_glob, std::optional<InputRole> role) {
  // The same globs as the config's: one it refuses is refused here too, not matched as written.
  if (auto why = glob_error(node_glob); !why.empty())
    throw Error("node glob '" + printable(node_glob, 80) + "': " + why);
  std::vector<QuantSlot*> out;
  for (auto& s : slots_)
    if (s.role != InputRole::kBias && (!role || *role == s.role) && node_matches_any(s.node_name, {node_glob}))
      out.push_back(&s);
  return out;
}

void QuantSlots::set_slot_bits(QuantSlot& s, int bits) {
  if (bits < 2 || bits > 16) throw Error("set_bits: bits must be between 2 and 16, got " + std::to_string(bits));
  QSpec spec = s.spec;
  spec.bits = bits;
  spec.element = QElement::kInt;  // a width is an integer grid's: a float8 input becomes symmetric int
  set_slot_spec(s, spec, std::to_string(bits) + " bits");
}

void QuantSlots::set_slot_spec(QuantSlot& s, const QSpec& spec, const std::string& what) {
  if (s.role == InputRole::kBias) throw Error(s.where() + ": a bias's precision follows its node's scales");
  for (const auto& why : {backend_rules(*backend_, spec, s.role == InputRole::kWeight ? "w" : "a"),
                          backend_->check_input(executor_->flat_node(s.node_index), s.input_index, s.role, spec)}) {
    if (why) throw Error(s.where() + ": " + what + " break the rules of backend '" + backend_name_ + "': " + *why);
  }
  s.spec = spec;
  // New objects for the new grid; the previous calibration no longer applies.
  s.observer = s.make_observer(ObserverContext{s.spec, s.observer_options, s.where()});
  s.quantizer = s.make_quantizer(QuantizerContext{s.spec, s.quantizer_options, s.where()});
  refuse_float8_without_support(s, s.role == InputRole::kWeight ? "w" : "a");
  s.calibrated = false;
  // Biases derive from their activation and weight scales: recompute them at calibration.
  for (auto& b : slots_)
    if (b.role == InputRole::kBias && b.node_index == s.node_index) b.calibrated = false;
}

std::size_t QuantSlots::set_bits(const std::string& node_glob, int bits, std::optional<InputRole> role) {
  if (bits < 2 || bits > 16) throw Error("set_bits: bits must be between 2 and 16, got " + std::to_string(bits));
  auto found = matching(node_glob, role);
  for (QuantSlot* s : found) set_slot_bits(*s, bits);
  return found.size();
}

at::Tensor QuantSlots::apply(std::size_t node, std::size_t input, const at::Tensor& x, bool force) {
  QuantSlot* slot = at(node, input);
  if (!slot) return x;
  QuantSlot& s = *slot;
  const bool on = force || (s.role == InputRole::kWeight ? w_on_ : a_on_);
  if (!on || !usable(s) || !x.defined() || x.is_nested() || !x.is_floating_point()) return x;
  if (!s.calibrated) throw Error(s.where() + ": quantization is on but the model was not calibrated");
  if (s.role == InputRole::kBias) return force || (w_on_ && a_on_) ? fake_quantize(x, s.bias_params, s.spec) : x;
  at::Tensor y = plugin_call(s, false, "forward", [&] { return s.quantizer->forward(x); });
  if (!y.defined() || y.sizes() != x.sizes()) {
    throw Error(s.where() + ": quantizer '" + s.quantizer_name + "' (plugin '" + s.quantizer_plugin +
                "') forward returned " + (y.defined() ? "shape " + c10::str(y.sizes()) : std::string("no tensor")) +
                " for an input of shape " + c10::str(x.sizes()));
  }
  return y;
}

void QuantSlots::observe(std::size_t node, std::size_t input, const at::Tensor& x) {
  QuantSlot* slot = at(node, input);
  if (!slot) return;
  QuantSlot& s = *slot;
  if (s.role != InputRole::kActivation || !s.active() || !x.defined()) return;
  if (x.is_nested() || !x.is_floating_point()) {
    // Integer or bool data (indices, masks, shape arithmetic) has nothing to quantize.
    logs::debug("{}",
                s.where() + ": carries " + std::string(c10::toString(x.scalar_type())) + " data, left unquantized");
    s.enabled = false;
    return;
  }
  plugin_call(s, true, "observe", [&] { s.observer->observe(x); });
  ++s.observed;
  s.observed_type = x.scalar_type();
}

void QuantSlots::reset_observers() {
  for (auto& s : slots_) {
    if (s.observer) s.observer->reset();
    s.observed = 0;
  }
}

/// Scale and zero point from an observer must have one value per tensor, per channel or per
/// group of the quantized tensor (checked against the weight itself where it is known).
void QuantSlots::check_qparams(const QuantSlot& s, const QParams& p, const char* call) const {
  auto fail = [&](const std::string& why) {
    throw Error(s.where() + ": observer '" + s.observer_name + "' (plugin '" + s.observer_plugin + "') " + call + " " +
                why);
  };
  if (!p.scale.defined() || !p.zero_point.defined()) fail("returned no scale or zero point");
  if (p.scale.numel() != p.zero_point.numel()) fail("returned scale and zero point of different sizes");
  if (!s.spec.per_channel && s.spec.group_size == 0 && p.scale.numel() != 1)
    fail("returned " + std::to_string(p.scale.numel()) + " scales for a per-tensor scheme");
  if (s.spec.per_channel && s.spec.group_size == 0 && s.role == InputRole::kWeight) {
    const at::Tensor& w = constant(s.node_index, s.tensor);
    if (s.spec.channel_axis < w.dim() && p.scale.numel() != w.size(s.spec.channel_axis))
      fail("returned " + std::to_string(p.scale.numel()) + " scales for " +
           std::to_string(w.size(s.spec.channel_axis)) + " channels");
  }
}

void QuantSlots::finish(QuantSlot& s) {
  if (s.role == InputRole::kActivation && s.observed == 0 && s.node_index >= graph_->num_nodes()) {
    // A branch the calibration data never took (or a loop that never iterated) has no range.
    logs::warn("{}", s.where() +
                         ": the calibration data never ran this part of a control-flow body; it stays in "
                         "float (calibrate with data that takes every branch to quantize it)");
    s.enabled = false;
    return;
  }
  if (s.role == InputRole::kWeight) {
    plugin_call(s, true, "reset", [&] { s.observer->reset(); });
    plugin_call(s, true, "observe", [&] { s.observer->observe(constant(s.node_index, s.tensor)); });
    page_out(constant(s.node_index, s.tensor));  // Note [Mapped weights]
  }
  s.range_candidates.clear();
  s.range.clear();
  if (s.role == InputRole::kActivation) {
    std::vector<RangeCandidate> offered;
    if (auto* ranges = dynamic_cast<OffersRanges*>(s.observer.get()))
      offered = plugin_call(s, true, "candidates", [&] { return ranges->candidates(); });
    for (const auto& c : offered) check_qparams(s, c.params, "candidates");
    if (offered.size() >= 2) s.range_candidates = std::move(offered);
  }
  const QParams p = plugin_call(s, true, "compute", [&] { return s.observer->compute(); });
  check_qparams(s, p, "compute");
  plugin_call(s, false, "initialize", [&] { s.quantizer->initialize(p); });
  s.observer->reset();  // statistics are no longer needed
  s.observed = 0;
  s.calibrated = true;
}

// Bias scale = activation scale x weight scale(s): what an int32 accumulator adds.
void QuantSlots::finish_bias(QuantSlot& s) {
  s.fake_fused = false;  // decided afresh from the current activation and weight slots
  const QuantSlot& act = slots_[static_cast<std::size_t>(s.bias_activation)];
  const QuantSlot& w = slots_[static_cast<std::size_t>(s.bias_weight)];
  const at::Tensor& bias = constant(s.node_index, s.tensor);
  const at::Tensor w_scale = w.calibrated ? w.quantizer->qparams().scale.to(at::kCPU, at::kFloat) : at::Tensor();
  if (!act.active() || !w.active() || !act.calibrated || !w.calibrated || act.spec.per_channel ||
      w.spec.group_size > 0 || (w.spec.per_channel && w_scale.numel() != bias.numel())) {
    s.fake_fused = true;  // the product has no single per-output scale: keep the bias float
    return;
  }
  s.bias_params.scale = act.quantizer->qparams().scale.to(at::kCPU, at::kFloat).reshape({}) * w_scale;
  s.bias_params.zero_point = at::zeros(s.bias_params.scale.sizes(), at::TensorOptions().dtype(at::kInt));
  s.calibrated = true;
}

QuantSlot* QuantSlots::finish_node(std::size_t node) {
  QuantSlot* reconstructed = nullptr;
  for (int idx : slot_of_.at(node)) {
    if (idx < 0) continue;
    QuantSlot& s = slots_[static_cast<std::size_t>(idx)];
    if (!s.active() || s.role == InputRole::kBias) continue;
    finish(s);
    if (s.role == InputRole::kWeight && s.learns_weight()) reconstructed = &s;
  }
  for (int idx : slot_of_[node])
    if (idx >= 0 && slots_[static_cast<std::size_t>(idx)].role == InputRole::kBias)
      finish_bias(slots_[static_cast<std::size_t>(idx)]);
  return reconstructed;
}

std::size_t QuantSlots::tie_grids() {
  auto tieable = [](const QuantSlot* q) {
    return q && q->active() && q->calibrated && q->quantizer && q->role == InputRole::kActivation &&
           !q->spec.per_channel && q->spec.group_size == 0;
  };
  auto same_scheme = [](const QSpec& a, const QSpec& b) {
    return a.bits == b.bits && a.symmetric == b.symmetric && a.narrow_range == b.narrow_range && a.element == b.element;
  };
  std::vector<std::pair<Input, Input>> ties;
  for (const auto& [reader, source] : ties_) {
    const QuantSlot *r = at(reader.first, reader.second), *s = at(source.first, source.second);
    if (tieable(r) && tieable(s) && same_scheme(r->spec, s->spec)) ties.push_back({reader, source});
  }
  if (ties.empty()) return 0;
  // Every quantizer of `from`'s tensor (one grid per tensor) takes `to`'s grid.
  auto give = [&](const QuantSlot& from, const QuantSlot& to) {
    const QParams p = from.quantizer->qparams();
    if (!p.defined() || p.scale.numel() != 1) return;
    for (auto& q : slots_)
      if (q.tensor == to.tensor && tieable(&q) && same_scheme(q.spec, to.spec)) q.quantizer->initialize(p);
  };
  // The grid the reader chose (for the layer that reads it) goes up the chain of data movement
  // (readers last to first), then down again, so that every input of the chain has one grid.
  std::stable_sort(ties.begin(), ties.end());
  for (auto it = ties.rbegin(); it != ties.rend(); ++it)
    give(*at(it->first.first, it->first.second), *at(it->second.first, it->second.second));
  for (const auto& [reader, source] : ties) give(*at(source.first, source.second), *at(reader.first, reader.second));
  // A bias's scale is its activation's times its weight's: again for the activations retied.
  for (auto& bias : slots_)
    if (bias.role == InputRole::kBias) finish_bias(bias);
  return ties.size();
}

void QuantSlots::finish_all() {
  for (auto& s : slots_)
    if (s.active() && s.role != InputRole::kBias) finish(s);
  for (auto& s : slots_)
    if (s.role == InputRole::kBias) finish_bias(s);
}

}  // namespace sparsebit
