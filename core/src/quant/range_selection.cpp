#include "quant/range_selection.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "quant/layer_error.h"
#include "quant/plugin_call.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::detail {

namespace {

/// Each process's errors replaced by their sum over the processes.
void sum_over_processes(std::vector<std::vector<double>>& errors, Distributed& group) {
  std::vector<double> flat;
  for (const auto& e : errors) flat.insert(flat.end(), e.begin(), e.end());
  std::vector<at::Tensor> sum{at::tensor(flat, at::TensorOptions().dtype(at::kDouble))};
  group.all_reduce_sum(sum, "summing the range selection's layer errors");
  const at::Tensor all = sum[0].to(at::kCPU).contiguous();
  std::size_t o = 0;
  for (auto& e : errors)
    for (double& v : e) v = all.data_ptr<double>()[o++];
}

/// Slot `i` takes the candidate of least error, and the biases that wait on it are finished.
void choose(QuantSlots& slots, std::size_t i, const std::vector<double>& errors, RangeSelection& r) {
  QuantSlot& s = slots.all()[i];
  std::size_t best = 0;
  for (std::size_t c = 1; c < errors.size(); ++c)
    if (errors[c] < errors[best]) best = c;
  const RangeCandidate& chosen = s.range_candidates[best];
  if (spdlog::should_log(spdlog::level::debug)) {
    std::string all;
    for (std::size_t c = 0; c < errors.size(); ++c)
      all += (c ? ", " : "") + s.range_candidates[c].name + " " + std::to_string(errors[c]);
    spdlog::debug("{}: relative layer errors {}; chose {}", s.where(), all, chosen.name);
  }
  plugin_call(s, false, "initialize", [&] { s.quantizer->initialize(chosen.params); });
  s.range = chosen.name;
  ++r.chosen[chosen.name];
  ++r.inputs;
  s.range_candidates.clear();
  for (auto& b : slots.all())
    if (b.role == InputRole::kBias && b.bias_activation == static_cast<int>(i)) slots.finish_bias(b);
}

/// Whether slots `a` and `b` were offered the same candidates (same names and grids).
bool same_candidates(const QuantSlot& a, const QuantSlot& b) {
  if (a.range_candidates.size() != b.range_candidates.size() || a.spec.describe() != b.spec.describe()) return false;
  for (std::size_t c = 0; c < a.range_candidates.size(); ++c) {
    const RangeCandidate &x = a.range_candidates[c], &y = b.range_candidates[c];
    if (x.name != y.name || !x.params.scale.cpu().equal(y.params.scale.cpu()) ||
        !x.params.zero_point.cpu().equal(y.params.zero_point.cpu()))
      return false;
  }
  return true;
}

/// The slots that choose (non-empty `errors`), grouped: readers of one tensor that were offered
/// the same candidates form one group (Note [One grid per tensor]); any other slot is alone.
std::vector<std::vector<std::size_t>> readers_of_one_tensor(const QuantSlots& slots,
                                                            const std::vector<std::vector<double>>& errors) {
  std::vector<std::vector<std::size_t>> groups;
  std::map<std::string, std::vector<std::size_t>> by_tensor;  // tensor -> indices into `groups`
  for (std::size_t i = 0; i < errors.size(); ++i) {
    if (errors[i].empty()) continue;
    const QuantSlot& s = slots.all()[i];
    auto& candidates = by_tensor[s.tensor];
    auto joins = std::find_if(candidates.begin(), candidates.end(),
                              [&](std::size_t g) { return same_candidates(slots.all()[groups[g].front()], s); });
    if (joins != candidates.end()) {
      groups[*joins].push_back(i);
    } else {
      candidates.push_back(groups.size());
      groups.push_back({i});
    }
  }
  return groups;
}

}  // namespace

RangeSelection select_ranges(Executor& executor, QuantSlots& slots,
                             const std::vector<std::map<std::string, at::Tensor>>& batches, std::int64_t samples,
                             Distributed* group) {
  const auto start = std::chrono::steady_clock::now();
  RangeSelection r;
  r.samples = samples;
  struct Target {
    std::vector<std::size_t> slots;  // indices into slots.all() of the inputs that choose
    std::size_t last_input = 0;      // the node's last present input: the hook then has them all
  };
  std::map<std::size_t, Target> targets;
  std::vector<std::vector<SliceSums>> sums(slots.all().size());  // [slot][output]
  for (std::size_t i = 0; i < slots.all().size(); ++i) {
    QuantSlot& s = slots.all()[i];
    if (s.range_candidates.empty()) continue;
    if (is_control_flow(executor.flat_node(s.node_index)) || !slots.usable(s)) {
      s.range_candidates.clear();  // Note [Choosing ranges by the consuming layer]: kept as computed
      continue;
    }
    Target& t = targets[s.node_index];
    t.slots.push_back(i);
    const Node& n = executor.flat_node(s.node_index);
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (!n.inputs[k].empty()) t.last_input = k;
  }
  if (targets.empty()) return r;

  std::optional<c10::InferenceMode> inference(std::in_place);  // while data flows (as calibration)
  auto evaluate = [&](std::size_t node, const std::vector<at::Tensor>& in) {
    const Reference reference = reference_of(executor.run_flat_node(node, in));
    std::vector<at::Tensor> base = in;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const QuantSlot* w = slots.at(node, k);
      if (w && w->role == InputRole::kWeight) base[k] = slots.apply(node, k, in[k], true);
    }
    for (std::size_t i : targets.at(node).slots) {
      const QuantSlot& s = slots.all()[i];
      const at::Tensor& x = in[s.input_index];
      if (!x.defined() || x.is_nested() || !x.is_floating_point()) continue;
      std::vector<at::Tensor> q = base;
      std::vector<std::vector<at::Tensor>> errs(reference.outputs.size());  // [output][candidate]
      for (std::size_t c = 0; c < s.range_candidates.size(); ++c) {
        const QParams& p = s.range_candidates[c].params;
        q[s.input_index] = fake_quantize(x, QParams{p.scale.to(x.device()), p.zero_point.to(x.device())}, s.spec);
        const auto got = executor.run_flat_node(node, q);
        for (std::size_t o = 0; o < reference.outputs.size(); ++o) {
          const at::Tensor& e = reference.energy[o];
          if (!e.defined()) continue;
          const bool comparable = o < got.size() && got[o].defined() && got[o].sizes() == reference.outputs[o].sizes();
          // An output the candidate cannot produce alike counts as all error.
          errs[o].push_back(comparable ? slice_error(got[o], reference.outputs[o]) : e.clone());
        }
      }
      if (sums[i].empty()) sums[i].resize(reference.outputs.size());
      for (std::size_t o = 0; o < reference.outputs.size() && o < sums[i].size(); ++o)
        if (reference.energy[o].defined()) sums[i][o].add(reference.energy[o], errs[o]);
    }
  };
  std::map<std::size_t, std::vector<at::Tensor>> pending;
  for (const auto& feeds : batches) {
    executor.run(feeds, [&](std::size_t n, std::size_t k, const at::Tensor& x) {
      auto t = targets.find(n);
      if (t == targets.end()) return x;
      auto& in = pending[n];
      if (in.empty()) in.resize(executor.flat_node(n).inputs.size());
      in[k] = x;
      if (k == t->second.last_input) {
        evaluate(n, in);
        pending.erase(n);
      }
      return x;
    });
  }

  inference.reset();
  // Parameters made from here on are ordinary tensors that QAT can train.
  c10::NoGradGuard no_grad;
  // Each candidate's error over the samples, relative per slice (Note [Relative layer error]).
  std::vector<std::vector<double>> errors(slots.all().size());
  for (std::size_t i = 0; i < sums.size(); ++i) {
    const QuantSlot& s = slots.all()[i];
    if (s.range_candidates.empty() || !targets.count(s.node_index)) continue;
    errors[i].assign(s.range_candidates.size(), 0.0);
    for (const auto& out : sums[i])
      for (std::size_t c = 0; c < errors[i].size() && c < out.error.size(); ++c) errors[i][c] += out.relative(c);
  }
  if (group) sum_over_processes(errors, *group);  // every process chooses from the sum of all errors
  for (const auto& readers : readers_of_one_tensor(slots, errors)) {
    std::vector<double> sum(errors[readers.front()].size(), 0.0);
    for (std::size_t i : readers)
      for (std::size_t c = 0; c < sum.size(); ++c) sum[c] += errors[i][c];
    for (std::size_t i : readers) choose(slots, i, sum, r);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace sparsebit::detail
