// Merging calibration states across processes (distributed_merge.h).

#include "quant/distributed_merge.h"

#include <ATen/ATen.h>

#include "base/log.h"
#include "quant/plugin_call.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {
namespace {

// The observer's merging role (Note [Distributed observers]), null without.
MergeableObserver* mergeable(const QuantSlot& s) { return dynamic_cast<MergeableObserver*>(s.observer.get()); }

}  // namespace

Distributed* dividing_group(const QuantSlots& slots, bool layer_passes, bool reconstruction) {
  Distributed* group = distributed();
  if (!group) return nullptr;
  std::string why;
  if (layer_passes) why = "a layer pass works on each layer's cached data";
  if (why.empty() && reconstruction) why = "layer reconstruction (adaround) trains on each layer's cached data";
  for (const auto& s : slots.all()) {
    if (!why.empty()) break;
    if (!s.active() || !s.observer) continue;
    if (s.role == InputRole::kActivation && !mergeable(s))
      why = s.where() + ": observer '" + s.observer_name + "' (plugin '" + s.observer_plugin +
            "') cannot merge its state";
    else if (s.role == InputRole::kWeight && s.solved() && !dynamic_cast<MergesInputs*>(s.quantizer.get()))
      why = s.where() + ": quantizer '" + s.quantizer_name + "' (plugin '" + s.quantizer_plugin +
            "') cannot merge its layer inputs";
  }
  if (why.empty()) return group;
  logs::info("{}", "every process calibrates on all the data (" + why + ")");
  return nullptr;
}

void merge_observers(Distributed& group, const std::vector<QuantSlot*>& slots, const at::Device& device,
                     const std::string& what) {
  std::vector<QuantSlot*> merged;
  for (QuantSlot* s : slots)
    if (s->role == InputRole::kActivation && mergeable(*s)) merged.push_back(s);
  if (merged.empty()) return;
  // Per slot: [tensor count, observed], then its state's tensors.
  std::vector<at::Tensor> mine;
  std::vector<std::vector<at::Tensor>> own;
  for (QuantSlot* s : merged) {
    own.push_back(plugin_call(*s, true, "state", [&] { return mergeable(*s)->state(); }));
    mine.push_back(at::tensor({static_cast<std::int64_t>(own.back().size()), s->observed}, at::kLong));
    for (const auto& t : own.back()) mine.push_back(t);
  }
  const auto all = group.all_gather(mine, what);
  std::vector<std::size_t> at_(all.size(), 0);
  for (std::size_t i = 0; i < merged.size(); ++i) {
    QuantSlot& s = *merged[i];
    plugin_call(s, true, "reset", [&] { s.observer->reset(); });
    std::int64_t observed = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
      const auto& theirs = all[r];
      const at::Tensor head = theirs.at(at_[r]++);
      const std::int64_t n = head[0].item<std::int64_t>();
      observed += head[1].item<std::int64_t>();
      std::vector<at::Tensor> state;
      for (std::int64_t k = 0; k < n; ++k) {
        const at::Tensor& t = theirs.at(at_[r]++);
        // Back where this process keeps it (the calibration device when it observed nothing).
        const auto kk = static_cast<std::size_t>(k);
        state.push_back(t.to(kk < own[i].size() ? own[i][kk].device() : device));
      }
      if (!state.empty()) plugin_call(s, true, "merge", [&] { mergeable(s)->merge(state); });
    }
    s.observed = observed;
  }
}

void merge_quantizer_inputs(Distributed& group, QuantSlot& slot, const std::string& what) {
  auto& merges = dynamic_cast<MergesInputs&>(*slot.quantizer);  // checked by distributed_calibration
  auto sums = plugin_call(slot, false, "input_state", [&] { return merges.input_state(); });
  group.all_reduce_sum(sums, what);
  plugin_call(slot, false, "merge_inputs", [&] { merges.merge_inputs(sums); });
}

}  // namespace sparsebit
