// Preparing the accuracy target's remedies: the objects each layer takes under each remedy
// (target_search.h).

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/log.h"
#include "quant/quant_model_access.h"
#include "quant/range_selection.h"
#include "quant/target_search.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::target_detail {

void TargetSearch::prepare_remedies() {
  for (int r : ladder_) {
    if (r == kRange) prepare_ranges();
    if (r == kPerChannel) prepare_per_channel();
    if (r == kInt16) prepare_int16();
  }
}

void TargetSearch::prepare_ranges() {
  if (!d_.range_observer) {
    logs::warn(
        "target: the range remedy is skipped: no observer offers candidate ranges (is the 'auto' "
        "observer's plugin disabled?)");
    return;
  }
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  const Options no_options("[target]");
  std::map<std::size_t, std::unique_ptr<Observer>> observers;
  for (const auto& l : layers_)
    if (!is_control_flow(qm_.executor().flat_node(l.node)))
      for (auto i : l.activations) {
        const QuantSlot& s = qs.all()[i];
        observers[i] = d_.range_observer(ObserverContext{s.spec, no_options, s.where()});
      }
  if (observers.empty()) return;
  std::set<std::pair<std::size_t, std::size_t>> edges;
  std::map<std::pair<std::size_t, std::size_t>, std::size_t> slot_at;
  for (const auto& [i, o] : observers) slot_at[{qs.all()[i].node_index, qs.all()[i].input_index}] = i;
  stream_calibration([&](std::size_t n, std::size_t k, const at::Tensor& x) {
    auto it = slot_at.find({n, k});
    if (it != slot_at.end() && x.defined() && !x.is_nested() && x.is_floating_point())
      observers[it->second]->observe(x);
  });
  // Each input chooses among its candidates and the range it has, which comes first and so
  // stays on ties; the choices become the remedy's objects.
  const std::string kAsCalibrated = "as calibrated";
  std::map<std::size_t, SlotObjects> parked;
  for (auto& [i, o] : observers) {
    auto* ranges = dynamic_cast<OffersRanges*>(o.get());
    if (!ranges) continue;
    std::vector<RangeCandidate> offered = ranges->candidates();
    if (offered.empty()) continue;
    QuantSlot& s = qs.all()[i];
    const QParams current = s.quantizer->qparams();
    parked.emplace(i, take(s));
    s.observer = s.make_observer(ObserverContext{s.spec, s.observer_options, s.where()});
    s.quantizer = s.make_quantizer(QuantizerContext{s.spec, s.quantizer_options, s.where()});
    s.range_candidates = {RangeCandidate{kAsCalibrated, current}};
    for (auto& c : offered) s.range_candidates.push_back(std::move(c));
  }
  std::vector<std::map<std::string, at::Tensor>> batches;
  for (const auto& x : d_.holdout) batches.push_back(feeds(x));
  detail::select_ranges(qm_.executor(), qs, batches, static_cast<std::int64_t>(batches.size()), nullptr, 0, nullptr);
  for (auto& [i, o] : parked) {
    QuantSlot& s = qs.all()[i];
    s.range_candidates.clear();
    if (s.range != kAsCalibrated && !s.range.empty()) objects_[kRange][i] = take(s);
    put(s, std::move(o));
  }
  finish_biases();
}

void TargetSearch::prepare_per_channel() {
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  for (const auto& l : layers_)
    for (auto i : l.slots) {
      QuantSlot& s = qs.all()[i];
      if (s.role != InputRole::kWeight || s.spec.per_channel || s.spec.group_size > 0) continue;
      QSpec wide = s.spec;
      wide.per_channel = true;
      SlotObjects parked = take(s);
      try {
        qs.set_slot_spec(s, wide, "per-channel weights");
        qs.finish(s);
        objects_[kPerChannel][i] = take(s);
      } catch (const Error& e) {
        logs::debug("target: no per-channel remedy for {}", e.what());
      }
      put(s, std::move(parked));
    }
  finish_biases();
}

void TargetSearch::prepare_int16() {
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  std::set<std::size_t> wide;
  for (const auto& l : layers_) wide.insert(l.activations.begin(), l.activations.end());
  // The 8-bit objects are parked while set_slot_bits gives each slot fresh 16-bit ones.
  std::map<std::size_t, SlotObjects> parked;
  try {
    for (auto i : wide) {
      parked.emplace(i, take(qs.all()[i]));
      qs.set_slot_bits(qs.all()[i], 16);
    }
    std::set<std::pair<std::size_t, std::size_t>> edges;
    for (auto i : wide) edges.insert({qs.all()[i].node_index, qs.all()[i].input_index});
    const std::int64_t seen = stream_calibration([&](std::size_t n, std::size_t k, const at::Tensor& x) {
      if (edges.count({n, k})) qs.observe(n, k, x);
    });
    if (seen == 0) throw Error("target: the calibration data yielded no samples for the 16-bit observers");
    for (auto i : wide)
      if (qs.all()[i].active()) qs.finish(qs.all()[i]);
  } catch (const Error& e) {
    for (auto& [i, o] : parked) put(qs.all()[i], std::move(o));
    finish_biases();
    logs::warn("target: the int16 remedy is skipped: {}", e.what());
    return;
  }
  for (auto& [i, o] : parked) {
    objects_[kInt16][i] = take(qs.all()[i]);
    put(qs.all()[i], std::move(o));
  }
  finish_biases();
}

void TargetSearch::finish_biases() {
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  for (const auto& l : layers_)
    for (auto b : l.biases)
      if (qs.all()[b].enabled) qs.finish_bias(qs.all()[b]);
}

std::int64_t TargetSearch::stream_calibration(
    const std::function<void(std::size_t, std::size_t, const at::Tensor&)>& see) {
  auto data = d_.calibration.open(qm_.graph().inputs);
  const Config& c = qm_.config();
  Batcher batcher(*data, qm_.graph().inputs, c.calibration.batch_size, c.calibration.count);
  const at::Device device(c.calibration.device);
  std::int64_t seen = 0;
  qm_.set_quant(false, false);
  while (auto b = batcher.next()) {
    std::map<std::string, at::Tensor> f;
    for (std::size_t k = 0; k < b->inputs.size(); ++k) f[qm_.graph().inputs[k].name] = b->inputs[k].to(device);
    qm_.executor().run(f, [&](std::size_t n, std::size_t k, const at::Tensor& x) {
      see(n, k, x);
      return x;
    });
    seen += b->rows;
  }
  return seen;
}

}  // namespace sparsebit::target_detail
