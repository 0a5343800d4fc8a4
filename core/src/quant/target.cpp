// The accuracy target's search and report (Note [Accuracy target] in sparsebit/core/target.h).

#include "sparsebit/core/target.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "base/log.h"
#include "quant/layer_error.h"
#include "quant/quant_model_access.h"
#include "quant/range_selection.h"
#include "quant/target_search.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace target_detail {

int remedy_of(const std::string& name) {
  for (int r = kRange; r < kRemedies; ++r)
    if (name == kRemedyNames[r]) return r;
  throw Error("target: unknown remedy '" + name + "'");
}
double sqnr_db(double relative_error) { return relative_error > 0 ? -10 * std::log10(relative_error) : 999.0; }
void swap_objects(QuantSlot& s, SlotObjects& o) {
  std::swap(s.spec, o.spec);
  std::swap(s.observer, o.observer);
  std::swap(s.quantizer, o.quantizer);
  std::swap(s.calibrated, o.calibrated);
  std::swap(s.range, o.range);
}
SlotObjects take(QuantSlot& s) {
  return SlotObjects{s.spec, std::move(s.observer), std::move(s.quantizer), s.calibrated, s.range};
}
void put(QuantSlot& s, SlotObjects&& o) {
  s.spec = o.spec;
  s.observer = std::move(o.observer);
  s.quantizer = std::move(o.quantizer);
  s.calibrated = o.calibrated;
  s.range = std::move(o.range);
}

TargetReport TargetSearch::run(const ProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  collect_layers();
  report_.target = t_.describe();
  report_.quantized_layers = layers_.size();
  report_.budget = t_.max_fallback_layers >= 0 ? static_cast<std::size_t>(t_.max_fallback_layers)
                                               : std::max<std::size_t>(1, layers_.size() / 10);  // at most 10%
  report_.budget = std::min(report_.budget, layers_.size());
  cache_references();
  state_.assign(layers_.size(), kNone);
  report_.before = measure();
  std::vector<int> best_state = state_;
  double best = report_.before;
  report_.reached = meets(best);
  if (!report_.reached && !layers_.empty()) {
    const auto s0 = std::chrono::steady_clock::now();
    prepare_remedies();
    measure_layers(progress);
    report_.sensitivity_seconds = seconds_since(s0);
    search(best, best_state);
  }
  configure(best_state);
  report_.after = best;
  int costliest = kNone;
  for (auto l : ranked_) {
    report_.ranking.push_back(sensitivity(l));
    if (state_[l] == kNone) continue;
    report_.fallback_layers.push_back(sensitivity(l));
    ++report_.remedies[kRemedyNames[state_[l]]];
    costliest = std::max(costliest, state_[l]);
  }
  report_.precision = kRemedyNames[costliest];
  qm_.set_quant(false, false);
  report_.seconds = seconds_since(t0);
  return report_;
}

LayerSensitivity TargetSearch::sensitivity(std::size_t l) const {
  const Node* n = &qm_.executor().flat_node(layers_[l].node);
  const double e = layers_[l].error[kNone];
  LayerSensitivity r{n->name, n->op_type, e == kUnknown ? std::nan("") : sqnr_db(e), kRemedyNames[state_[l]]};
  if (state_[l] != kNone) r.remedied_sqnr_db = sqnr_db(layers_[l].error[state_[l]]);
  return r;
}

void TargetSearch::collect_layers() {
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  std::map<std::size_t, std::size_t> layer_of;  // node -> layer
  const auto& slots = qs.all();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const QuantSlot& s = slots[i];
    if (s.role == InputRole::kBias || !qs.usable(s)) continue;
    auto [it, fresh] = layer_of.emplace(s.node_index, layers_.size());
    if (fresh) layers_.push_back(Layer{s.node_index});
    layers_[it->second].slots.push_back(i);
    if (s.role == InputRole::kActivation) layers_[it->second].activations.push_back(i);
  }
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i].role == InputRole::kBias && layer_of.count(slots[i].node_index))
      layers_[layer_of[slots[i].node_index]].biases.push_back(i);
  std::sort(layers_.begin(), layers_.end(), [](const Layer& a, const Layer& b) { return a.node < b.node; });
  for (const auto& l : layers_)
    for (auto s : l.biases) bias_enabled_[s] = slots[s].enabled;
}

std::vector<at::Tensor> TargetSearch::measured(const std::vector<at::Tensor>& outs) const {
  std::vector<at::Tensor> kept;
  for (std::size_t i = 0; i < outs.size(); ++i)
    if (i >= measured_.size() || measured_[i]) kept.push_back(outs[i]);
  return float_outputs(kept);
}

void TargetSearch::cache_references() {
  if (d_.holdout.empty()) throw Error("target: no held-out samples to measure " + t_.metric + " on");
  report_.measured_on = d_.holdout_description;
  const auto& outputs = qm_.graph().outputs;
  measured_.assign(outputs.size(), t_.outputs.empty());
  for (const auto& name : t_.outputs) {
    auto it = std::find_if(outputs.begin(), outputs.end(), [&](const ValueInfo& v) { return v.name == name; });
    if (it == outputs.end()) {
      std::string names;
      for (const auto& v : outputs) names += (names.empty() ? "'" : ", '") + v.name + "'";
      throw Error("target outputs: the model has no output '" + name + "'; its outputs are " + names);
    }
    measured_[static_cast<std::size_t>(it - outputs.begin())] = true;
  }
  if (!t_.outputs.empty()) {
    std::string names;
    for (const auto& n : t_.outputs) names += (names.empty() ? "'" : ", '") + n + "'";
    report_.measured_on += ", output" + std::string(t_.outputs.size() > 1 ? "s " : " ") + names;
  }
  report_.samples = static_cast<std::int64_t>(d_.holdout.size());
  qm_.set_quant(false, false);
  for (const auto& x : d_.holdout) reference_.push_back(measured(qm_.forward(x)));
  if (t_.metric == "top1-drop") {
    if (d_.eval.empty() || !d_.eval_labels.defined())
      throw Error("target top1-drop needs evaluation data with labels (--eval-data and --eval-labels)");
    report_.measured_on = d_.eval_description;
    std::int64_t n = 0, correct = 0;
    for (const auto& x : d_.eval) {
      at::Tensor top = top1(qm_.forward(x));
      correct += (top == labels(n, top.size(0))).sum().item<std::int64_t>();
      n += top.size(0);
    }
    report_.samples = n;
    fp32_accuracy_ = 100.0 * static_cast<double>(correct) / static_cast<double>(n);
  }
}

at::Tensor TargetSearch::top1(const std::vector<at::Tensor>& outs) {
  const at::Tensor& y = outs.at(0);
  return y.reshape({y.size(0), -1}).argmax(1).to(at::kCPU);
}

at::Tensor TargetSearch::labels(std::int64_t first, std::int64_t rows) const {
  if (first + rows > d_.eval_labels.numel())
    throw Error(d_.eval_description + ": fewer labels (" + std::to_string(d_.eval_labels.numel()) +
                ") than evaluation samples");
  return d_.eval_labels.narrow(0, first, rows);
}

double TargetSearch::measure() {
  ++report_.evaluations;
  qm_.set_quant(true, true);
  if (t_.metric == "top1-drop") {
    std::int64_t n = 0, correct = 0;
    for (const auto& x : d_.eval) {
      at::Tensor top = top1(qm_.forward(x));
      correct += (top == labels(n, top.size(0))).sum().item<std::int64_t>();
      n += top.size(0);
    }
    return fp32_accuracy_ - 100.0 * static_cast<double>(correct) / static_cast<double>(n);
  }
  Agreement a;
  if (t_.metric == "ctc-agreement") a.ctc_blank = t_.ctc_blank;
  for (std::size_t i = 0; i < d_.holdout.size(); ++i) a.add(reference_[i], measured(qm_.forward(d_.holdout[i])));
  return a.metric(t_.metric);
}

std::map<std::string, at::Tensor> TargetSearch::feeds(const std::vector<at::Tensor>& x) const {
  std::map<std::string, at::Tensor> f;
  for (std::size_t k = 0; k < x.size(); ++k) f[qm_.graph().inputs[k].name] = x[k];
  return f;
}

void TargetSearch::measure_layers(const ProgressFn& progress) {
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  Executor& ex = qm_.executor();
  struct Work {
    std::size_t layer = 0, last_input = 0;
    std::vector<int> remedies;            // as calibrated first, then those that apply
    std::vector<detail::SliceSums> sums;  // per output
  };
  std::map<std::size_t, Work> work;  // node -> what to measure there
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    if (is_control_flow(ex.flat_node(layer.node))) continue;
    Work w{l};
    const Node& n = ex.flat_node(layer.node);
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (!n.inputs[k].empty()) w.last_input = k;
    w.remedies.push_back(kNone);
    for (int r : {kRange, kPerChannel, kInt16})
      for (auto s : layer.slots)
        if (objects_[r].count(s)) {
          w.remedies.push_back(r);
          break;
        }
    work.emplace(layer.node, std::move(w));
  }
  auto evaluate = [&](std::size_t node, Work& w, const std::vector<at::Tensor>& in) {
    const detail::Reference ref = detail::reference_of(ex.run_flat_node(node, in));
    std::vector<std::vector<at::Tensor>> errs(ref.outputs.size());  // [output][remedy]
    for (int r : w.remedies) {
      std::vector<at::Tensor> q = in;
      for (auto i : layers_[w.layer].slots) {
        QuantSlot& s = qs.all()[i];
        auto o = objects_[r].find(i);
        if (o != objects_[r].end()) swap_objects(s, o->second);
        q[s.input_index] = qs.apply(node, s.input_index, in[s.input_index], true);
        if (o != objects_[r].end()) swap_objects(s, o->second);
      }
      const auto got = ex.run_flat_node(node, q);
      for (std::size_t o = 0; o < ref.outputs.size(); ++o) {
        if (!ref.energy[o].defined()) continue;
        const bool alike = o < got.size() && got[o].defined() && got[o].sizes() == ref.outputs[o].sizes();
        errs[o].push_back(alike ? detail::slice_error(got[o], ref.outputs[o]) : ref.energy[o].clone());
      }
    }
    if (w.sums.empty()) w.sums.resize(ref.outputs.size());
    for (std::size_t o = 0; o < ref.outputs.size() && o < w.sums.size(); ++o)
      if (ref.energy[o].defined()) w.sums[o].add(ref.energy[o], errs[o]);
  };
  qm_.set_quant(false, false);
  std::map<std::size_t, std::vector<at::Tensor>> pending;
  for (std::size_t x = 0; x < d_.holdout.size(); ++x) {
    ex.run(feeds(d_.holdout[x]), [&](std::size_t n, std::size_t k, const at::Tensor& v) {
      auto it = work.find(n);
      if (it == work.end()) return v;
      auto& in = pending[n];
      if (in.empty()) in.resize(ex.flat_node(n).inputs.size());
      in[k] = v;
      if (k == it->second.last_input) {
        evaluate(n, it->second, in);
        pending.erase(n);
      }
      return v;
    });
    if (progress) progress(static_cast<std::int64_t>(x + 1), static_cast<std::int64_t>(d_.holdout.size()));
  }
  for (auto& [node, w] : work) {
    Layer& layer = layers_[w.layer];
    for (std::size_t v = 0; v < w.remedies.size(); ++v) {
      double e = 0;
      for (const auto& sums : w.sums) e += sums.mean_relative(v);
      layer.error[w.remedies[v]] = e;
    }
  }
  ranked_.resize(layers_.size());
  std::iota(ranked_.begin(), ranked_.end(), 0);
  std::stable_sort(ranked_.begin(), ranked_.end(), [&](std::size_t a, std::size_t b) {
    const double ea = layers_[a].error[kNone], eb = layers_[b].error[kNone];
    if ((ea == kUnknown) != (eb == kUnknown)) return eb == kUnknown;  // measured layers first
    return ea > eb;
  });
}

std::vector<int> TargetSearch::remedied(std::size_t j) const {
  std::vector<int> want(layers_.size(), kNone);
  const double bound =
      j < ranked_.size() && layers_[ranked_[j]].error[kNone] != kUnknown ? layers_[ranked_[j]].error[kNone] : 0.0;
  for (std::size_t i = 0; i < j && i < ranked_.size(); ++i) {
    const Layer& l = layers_[ranked_[i]];
    int pick = kNone;
    for (int r : ladder_)
      if (l.error[r] <= bound) {
        pick = r;
        break;
      }
    if (pick == kNone) {
      double least = l.error[kNone];
      for (int r : ladder_)
        if (l.error[r] < least) least = l.error[r], pick = r;
    }
    want[ranked_[i]] = pick;
  }
  return want;
}

std::size_t TargetSearch::cost(const std::vector<int>& want) const {
  return static_cast<std::size_t>(std::count_if(want.begin(), want.end(), costly));
}

void TargetSearch::search(double& best, std::vector<int>& best_state) {
  std::size_t j_max = 0;
  for (std::size_t j = 1; j <= ranked_.size(); ++j)
    if (cost(remedied(j)) <= report_.budget) j_max = j;
  if (j_max == 0) return;
  auto try_j = [&](std::size_t j) {
    configure(remedied(j));
    const double v = measure();
    logs::debug("target: {} layers remedied: {} = {:.6g}", j, t_.metric, v);
    if (better(v, best)) best = v, best_state = state_;
    return v;
  };
  const double v = try_j(j_max);
  if (!meets(v)) return;
  std::size_t lo = 0, hi = j_max;  // lo misses (as calibrated did), hi holds
  double at_hi = v;
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    const double m = try_j(mid);
    if (meets(m)) hi = mid, at_hi = m;
    else lo = mid;
  }
  best_state = remedied(hi), best = at_hi;
  report_.reached = true;
}

void TargetSearch::configure(const std::vector<int>& want) {
  QuantSlots& qs = QuantModelAccess::slots(qm_);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    if (state_[l] == want[l]) continue;
    const Layer& layer = layers_[l];
    // Back to the calibrated state first, then into the wanted one.
    for (int r : {state_[l], want[l]}) {
      if (r == kFloat) {
        const bool back = r == state_[l];
        for (auto s : layer.slots) qs.all()[s].enabled = back;
        for (auto s : layer.biases) qs.all()[s].enabled = back && bias_enabled_[s];
      } else if (r != kNone) {
        for (auto s : layer.slots)
          if (auto o = objects_[r].find(s); o != objects_[r].end()) swap_objects(qs.all()[s], o->second);
      }
    }
    for (auto s : layer.biases)
      if (qs.all()[s].enabled) qs.finish_bias(qs.all()[s]);
    state_[l] = want[l];
  }
}

}  // namespace target_detail

using target_detail::TargetSearch;

TargetReport meet_target(QuantModel& qm, const TargetConfig& target, const TargetData& data,
                         const ProgressFn& progress) {
  c10::InferenceMode guard;
  for (const auto& s : qm.slots())
    if (QuantModelAccess::slots(qm).usable(s) && !s.calibrated)
      throw Error(s.where() + ": the accuracy target needs a calibrated model; calibrate first");
  TargetSearch search(qm, target, data);
  return search.run(progress);
}

std::string target_report_json(const TargetReport& r) {
  using nlohmann::json;
  auto rows = [](const std::vector<LayerSensitivity>& v) {
    json a = json::array();
    for (const auto& e : v) {
      json row = {{"node", e.node}, {"op_type", e.op_type}, {"sqnr_db", e.sqnr_db}};
      if (!e.remedy.empty()) row["remedy"] = e.remedy, row["remedied_sqnr_db"] = e.remedied_sqnr_db;
      a.push_back(row);
    }
    return a;
  };
  json j = {{"target", r.target},
            {"measured_on", r.measured_on},
            {"samples", r.samples},
            {"before", r.before},
            {"after", r.after},
            {"reached", r.reached},
            {"precision", r.precision},
            {"fallback_layers", rows(r.fallback_layers)},
            {"remedies", r.remedies},
            {"quantized_layers", r.quantized_layers},
            {"budget", r.budget},
            {"evaluations", r.evaluations},
            {"sensitivity_seconds", r.sensitivity_seconds},
            {"seconds", r.seconds},
            {"sensitivity", rows(r.ranking)}};
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sparsebit