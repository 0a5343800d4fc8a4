#include "quant/range_selection.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "base/log.h"
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

/// Slot `i` takes candidate `c` (quantizer and the biases that wait on it); nothing is recorded.
void take(QuantSlots& slots, std::size_t i, std::size_t c) {
  QuantSlot& s = slots.all()[i];
  plugin_call(s, false, "initialize", [&] { s.quantizer->initialize(s.range_candidates[c].params); });
  for (auto& b : slots.all())
    if (b.role == InputRole::kBias && b.bias_activation == static_cast<int>(i)) slots.finish_bias(b);
}

/// Slot `i` keeps candidate `c` for good: recorded and its candidates cleared.
void choose(QuantSlots& slots, std::size_t i, std::size_t c, const std::vector<double>& errors, RangeSelection& r) {
  QuantSlot& s = slots.all()[i];
  if (logs::debug_enabled()) {
    std::string all;
    for (std::size_t k = 0; k < errors.size(); ++k)
      all += (k ? ", " : "") + s.range_candidates[k].name + " " + std::to_string(errors[k]);
    logs::debug("{}: relative layer errors {}; chose {}", s.where(), all, s.range_candidates[c].name);
  }
  take(slots, i, c);
  s.range = s.range_candidates[c].name;
  ++r.chosen[s.range];
  ++r.inputs;
  s.range_candidates.clear();
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

/// Whether two parameter sets give the same grid.
bool same_params(const QParams& a, const QParams& b) {
  return a.scale.sizes() == b.scale.sizes() && a.scale.cpu().equal(b.scale.cpu()) &&
         a.zero_point.cpu().to(at::kLong).equal(b.zero_point.cpu().to(at::kLong));
}

/// Squared error of the quantized float outputs and energy of the float ones, added to `sums`
/// ({error, energy}); anything not finite, or an output that changed shape, makes the error
/// infinite.
void add_output_error(const std::vector<at::Tensor>& f, const std::vector<at::Tensor>& q, std::vector<double>& sums) {
  for (std::size_t o = 0; o < f.size(); ++o) {
    if (!f[o].defined() || f[o].is_nested() || !f[o].is_floating_point()) continue;  // sequences are not judged
    if (o >= q.size() || !q[o].defined() || q[o].is_nested() || q[o].sizes() != f[o].sizes()) {
      sums[0] = std::numeric_limits<double>::infinity();
      continue;
    }
    const at::Tensor fd = f[o].to(at::kCPU, at::kDouble);
    const double e = (q[o].to(at::kCPU, at::kDouble) - fd).pow(2).sum().item<double>();
    sums[0] += std::isfinite(e) ? e : std::numeric_limits<double>::infinity();
    sums[1] += fd.pow(2).sum().item<double>();
  }
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

RangeSelection select_ranges(Executor& executor, QuantSlots& slots, const std::vector<Feeds>& batches,
                             std::int64_t samples, const std::vector<Feeds>* judge, std::int64_t judged,
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
          const bool comparable = o < got.size() && got[o].defined() && !got[o].is_nested() &&
                                  got[o].sizes() == reference.outputs[o].sizes();
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
  // Each group: its candidates' summed errors, the layer's choice and the observer's own range.
  struct Choice {
    std::vector<std::size_t> readers;
    std::vector<double> error;
    std::size_t best = 0, own = 0;
  };
  std::vector<Choice> choices;
  for (auto& readers : readers_of_one_tensor(slots, errors)) {
    const std::size_t candidates = errors[readers.front()].size();
    Choice c{std::move(readers), std::vector<double>(candidates, 0.0)};
    for (std::size_t i : c.readers)
      for (std::size_t k = 0; k < c.error.size(); ++k) c.error[k] += errors[i][k];
    for (std::size_t k = 1; k < c.error.size(); ++k)
      if (c.error[k] < c.error[c.best]) c.best = k;
    const QuantSlot& s = slots.all()[c.readers.front()];
    const QParams own = s.quantizer->qparams();
    c.own = c.best;  // an observer whose own range is none of its candidates: its layer decides
    for (std::size_t k = 0; k < s.range_candidates.size(); ++k)
      if (same_params(s.range_candidates[k].params, own)) {
        c.own = k;
        break;
      }
    choices.push_back(std::move(c));
  }
  // Note [Choices judged at the output]: departures most helpful to their layer first.
  std::vector<std::size_t> departures;
  for (std::size_t g = 0; g < choices.size(); ++g)
    if (choices[g].best != choices[g].own) departures.push_back(g);
  std::stable_sort(departures.begin(), departures.end(), [&](std::size_t a, std::size_t b) {
    return choices[a].error[choices[a].own] - choices[a].error[choices[a].best] >
           choices[b].error[choices[b].own] - choices[b].error[choices[b].best];
  });
  for (std::size_t g : departures) r.departures += choices[g].readers.size();
  std::size_t keep = departures.size();  // how many of them stand
  if (judge && judged > 0 && !departures.empty()) {
    auto set_prefix = [&](std::size_t k) {
      for (std::size_t d = 0; d < departures.size(); ++d)
        for (std::size_t i : choices[departures[d]].readers)
          take(slots, i, d < k ? choices[departures[d]].best : choices[departures[d]].own);
    };
    std::vector<std::vector<at::Tensor>> reference;
    for (const auto& feeds : *judge) reference.push_back(executor.run(feeds));
    const bool w_on = slots.weights_on(), a_on = slots.activations_on();
    slots.set_quant(true, true);
    auto output_error = [&](std::size_t k) {
      set_prefix(k);
      std::vector<double> sums{0.0, 0.0};
      for (std::size_t b = 0; b < judge->size(); ++b)
        add_output_error(reference[b],
                         executor.run((*judge)[b], [&](std::size_t n, std::size_t in,
                                                       const at::Tensor& x) { return slots.apply(n, in, x); }),
                         sums);
      return sums;
    };
    std::vector<std::size_t> prefixes{0};
    for (std::size_t quarter = 1; quarter <= 4; ++quarter) {
      const std::size_t k = (departures.size() * quarter + 3) / 4;
      if (k != prefixes.back()) prefixes.push_back(k);
    }
    std::vector<std::vector<double>> sums;
    for (std::size_t k : prefixes) sums.push_back(output_error(k));
    slots.set_quant(w_on, a_on);
    if (group) sum_over_processes(sums, *group);  // every process decides on the same sums
    auto relative = [](const std::vector<double>& e) { return e[1] > 0 ? e[0] / e[1] : (e[0] > 0 ? 1.0 : 0.0); };
    std::size_t best = 0;  // the first of least error: the default on ties
    for (std::size_t p = 1; p < prefixes.size(); ++p)
      if (relative(sums[p]) < relative(sums[best])) best = p;
    if (logs::debug_enabled())
      for (std::size_t p = 0; p < prefixes.size(); ++p)
        logs::debug("range selection: {} of {} departures kept: output error {:.4g}", prefixes[p], departures.size(),
                    relative(sums[p]));
    keep = prefixes[best];
    r.judged_samples = judged;
    r.output_error_default = relative(sums[0]);
    r.output_error_kept = relative(sums[best]);
  } else if (judge) {
    keep = 0;  // nothing to judge on: the observers' own ranges stay
  }
  std::vector<std::size_t> final_choice(choices.size());
  for (std::size_t g = 0; g < choices.size(); ++g) final_choice[g] = choices[g].best;
  for (std::size_t d = keep; d < departures.size(); ++d) final_choice[departures[d]] = choices[departures[d]].own;
  for (std::size_t d = 0; d < keep; ++d) r.kept += choices[departures[d]].readers.size();
  for (std::size_t g = 0; g < choices.size(); ++g)
    for (std::size_t i : choices[g].readers) choose(slots, i, final_choice[g], choices[g].error, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace sparsebit::detail
