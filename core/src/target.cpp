#include "sparsebit/core/target.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "single_layer.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace {

enum Precision { kQuantized = 0, kInt16 = 1, kFloat = 2 };

/// Float outputs only: integer outputs (indices, lengths) carry no quantization error to measure.
std::vector<at::Tensor> float_outputs(const std::vector<at::Tensor>& outs) {
  std::vector<at::Tensor> r;
  for (const auto& o : outs)
    if (o.defined() && o.is_floating_point()) r.push_back(o.detach().to(at::kDouble).reshape({-1}));
  return r;
}

/// Error sums of quantized against float outputs, sample by sample.
struct Agreement {
  double sse = 0, ff = 0, worst_cosine = 1;
  std::int64_t n = 0;
  void add(const std::vector<at::Tensor>& f, const std::vector<at::Tensor>& q) {
    if (f.size() != q.size()) throw Error("target: the quantized model gave other outputs than the float one");
    double s_sse = 0, s_ff = 0, s_qq = 0, s_fq = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i].sizes() != q[i].sizes()) throw Error("target: an output changed shape between float and quantized runs");
      s_sse += (q[i] - f[i]).pow(2).sum().item<double>();
      s_ff += f[i].pow(2).sum().item<double>();
      s_qq += q[i].pow(2).sum().item<double>();
      s_fq += (f[i] * q[i]).sum().item<double>();
      n += f[i].numel();
    }
    const double cosine = s_ff > 0 && s_qq > 0 ? s_fq / std::sqrt(s_ff * s_qq) : (s_sse == 0 ? 1.0 : 0.0);
    worst_cosine = std::min(worst_cosine, cosine);
    sse += s_sse;
    ff += s_ff;
  }
  double sqnr_db() const { return sse > 0 ? 10 * std::log10(ff / sse) : 999.0; }
  double metric(const std::string& m) const {
    if (m == "cosine") return worst_cosine;
    if (m == "sqnr") return sqnr_db();
    return n > 0 ? sse / static_cast<double>(n) : 0;  // mse
  }
};

struct Layer {
  std::size_t node = 0;
  std::vector<std::size_t> slots;        // non-bias slots in use
  std::vector<std::size_t> activations;  // of those, the activation slots
  std::vector<std::size_t> biases;
  double sqnr_db = 0;
};

/// A slot's precision-dependent objects, swapped in and out as a layer changes precision.
struct SlotObjects {
  QSpec spec;
  std::unique_ptr<Observer> observer;
  std::unique_ptr<Quantizer> quantizer;
  bool calibrated = false;
};

void swap_objects(QuantSlot& s, SlotObjects& o) {
  std::swap(s.spec, o.spec);
  std::swap(s.observer, o.observer);
  std::swap(s.quantizer, o.quantizer);
  std::swap(s.calibrated, o.calibrated);
}

class TargetSearch {
 public:
  TargetSearch(QuantModel& qm, const TargetConfig& t, const TargetData& d) : qm_(qm), t_(t), d_(d) {}

  TargetReport run(const ProgressFn& progress) {
    const auto t0 = std::chrono::steady_clock::now();
    collect_layers();
    report_.target = t_.describe();
    report_.quantized_layers = layers_.size();
    report_.budget = t_.max_fallback_layers >= 0 ? static_cast<std::size_t>(t_.max_fallback_layers)
                                                 : std::max<std::size_t>(1, layers_.size() / 10);  // at most 10%
    report_.budget = std::min(report_.budget, layers_.size());
    cache_references();
    state_.assign(layers_.size(), kQuantized);
    report_.before = measure();
    double best = report_.before;
    std::vector<int> best_state = state_;
    report_.reached = meets(best);
    if (!report_.reached && !layers_.empty()) {
      const auto s0 = std::chrono::steady_clock::now();
      rank(progress);
      report_.sensitivity_seconds = seconds_since(s0);
      for (const auto& precision : t_.fallback) {
        const int p = precision == "int16" ? kInt16 : kFloat;
        if (p == kInt16 && !prepare_int16()) continue;
        std::vector<std::size_t> order;  // ranked layers that can take this precision
        for (auto l : ranked_)
          if (p == kFloat || !layers_[l].activations.empty()) order.push_back(l);
        const std::size_t k_max = std::min(report_.budget, order.size());
        if (k_max == 0) continue;
        auto try_k = [&](std::size_t k) {
          std::vector<int> want(layers_.size(), kQuantized);
          for (std::size_t i = 0; i < k; ++i) want[order[i]] = p;
          configure(want);
          const double v = measure();
          spdlog::debug("target: {} layers in {}: {} = {:.6g}", k, precision, t_.metric, v);
          if (better(v, best)) best = v, best_state = state_;
          return v;
        };
        double v = try_k(k_max);
        if (!meets(v)) continue;
        std::size_t lo = 0, hi = k_max;  // lo misses (every layer quantized did), hi holds
        double at_hi = v;
        while (hi - lo > 1) {
          const std::size_t mid = lo + (hi - lo) / 2;
          const double m = try_k(mid);
          if (meets(m)) hi = mid, at_hi = m;
          else lo = mid;
        }
        std::vector<int> chosen(layers_.size(), kQuantized);
        for (std::size_t i = 0; i < hi; ++i) chosen[order[i]] = p;
        best_state = chosen, best = at_hi;
        report_.reached = true;
        report_.precision = precision;
        break;
      }
    }
    configure(best_state);
    report_.after = best;
    for (auto l : ranked_)
      if (state_[l] != kQuantized) {
        report_.fallback_layers.push_back(sensitivity(l));
        if (report_.precision.empty()) report_.precision = state_[l] == kInt16 ? "int16" : "float";
      }
    for (auto l : ranked_) report_.ranking.push_back(sensitivity(l));
    qm_.set_quant(false, false);
    report_.seconds = seconds_since(t0);
    return report_;
  }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  bool meets(double v) const { return t_.higher_is_better() ? v >= t_.value : v <= t_.value; }
  bool better(double a, double b) const { return t_.higher_is_better() ? a > b : a < b; }

  LayerSensitivity sensitivity(std::size_t l) const {
    const Node* n = &qm_.executor().flat_node(layers_[l].node);
    return {n->name, n->op_type, layers_[l].sqnr_db};
  }

  void collect_layers() {
    QuantSlots& qs = qm_.quant_slots();
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

  /// Float outputs of every held-out sample, and the float top-1 on the evaluation data.
  void cache_references() {
    if (d_.holdout.empty()) throw Error("target: no held-out samples to measure " + t_.metric + " on");
    report_.measured_on = d_.holdout_description;
    report_.samples = static_cast<std::int64_t>(d_.holdout.size());
    qm_.set_quant(false, false);
    for (const auto& x : d_.holdout) reference_.push_back(float_outputs(qm_.forward(x)));
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

  static at::Tensor top1(const std::vector<at::Tensor>& outs) {
    const at::Tensor& y = outs.at(0);
    return y.reshape({y.size(0), -1}).argmax(1).to(at::kCPU);
  }
  at::Tensor labels(std::int64_t first, std::int64_t rows) const {
    if (first + rows > d_.eval_labels.numel())
      throw Error(d_.eval_description + ": fewer labels (" + std::to_string(d_.eval_labels.numel()) +
                  ") than evaluation samples");
    return d_.eval_labels.narrow(0, first, rows);
  }

  /// The metric of the current configuration.
  double measure() {
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
    for (std::size_t i = 0; i < d_.holdout.size(); ++i) a.add(reference_[i], float_outputs(qm_.forward(d_.holdout[i])));
    return a.metric(t_.metric);
  }

  /// Each layer quantized alone (weights, activations and bias), from the cached float values
  /// of each sample: only the nodes that read what the layer changed run again (Note
  /// [Single-layer runs]).
  void rank(const ProgressFn& progress) {
    std::vector<std::size_t> nodes;
    for (const auto& l : layers_) nodes.push_back(l.node);
    std::vector<Agreement> errors(layers_.size());
    detail::single_layer_outputs(
        qm_, d_.holdout, nodes,
        [&](std::size_t l, std::size_t x, const std::vector<at::Tensor>& outs) {
          errors[l].add(reference_[x], float_outputs(outs));
        },
        [&](std::size_t x) {
          if (progress) progress(static_cast<std::int64_t>(x + 1), static_cast<std::int64_t>(d_.holdout.size()));
        });
    for (std::size_t l = 0; l < layers_.size(); ++l) layers_[l].sqnr_db = errors[l].sqnr_db();
    ranked_.resize(layers_.size());
    std::iota(ranked_.begin(), ranked_.end(), 0);
    std::stable_sort(ranked_.begin(), ranked_.end(),
                     [&](std::size_t a, std::size_t b) { return layers_[a].sqnr_db < layers_[b].sqnr_db; });
  }

  /// 16-bit objects for every activation slot of every layer, calibrated once on the
  /// calibration data in float. False (with a warning) where the backend refuses 16 bits.
  bool prepare_int16() {
    if (int16_ready_) return true;
    QuantSlots& qs = qm_.quant_slots();
    std::set<std::size_t> wide;
    for (const auto& l : layers_) wide.insert(l.activations.begin(), l.activations.end());
    // The 8-bit objects are parked while set_slot_bits gives each slot fresh 16-bit ones.
    std::map<std::size_t, SlotObjects> parked;
    try {
      for (auto i : wide) {
        parked.emplace(i, take(qs.all()[i]));
        qs.set_slot_bits(qs.all()[i], 16);
      }
      observe_wide(wide);
    } catch (const Error& e) {
      for (auto& [i, o] : parked) put(qs.all()[i], std::move(o));
      finish_biases();
      spdlog::warn("target: the int16 fallback is skipped: {}", e.what());
      return false;
    }
    for (auto& [i, o] : parked) {
      int16_[i] = take(qs.all()[i]);
      put(qs.all()[i], std::move(o));
    }
    finish_biases();
    int16_ready_ = true;
    return true;
  }

  static SlotObjects take(QuantSlot& s) {
    return SlotObjects{s.spec, std::move(s.observer), std::move(s.quantizer), s.calibrated};
  }
  static void put(QuantSlot& s, SlotObjects&& o) {
    s.spec = o.spec;
    s.observer = std::move(o.observer);
    s.quantizer = std::move(o.quantizer);
    s.calibrated = o.calibrated;
  }
  void finish_biases() {
    QuantSlots& qs = qm_.quant_slots();
    for (const auto& l : layers_)
      for (auto b : l.biases)
        if (qs.all()[b].enabled) qs.finish_bias(qs.all()[b]);
  }

  /// Streams the calibration data through the float model into the 16-bit observers.
  void observe_wide(const std::set<std::size_t>& wide) {
    QuantSlots& qs = qm_.quant_slots();
    std::set<std::pair<std::size_t, std::size_t>> edges;
    for (auto i : wide) edges.insert({qs.all()[i].node_index, qs.all()[i].input_index});
    auto data = d_.calibration();
    const Config& c = qm_.config();
    Batcher batcher(*data, qm_.graph().inputs, c.calibration.batch_size, c.calibration.count);
    const at::Device device(c.calibration.device);
    std::int64_t seen = 0;
    while (auto b = batcher.next()) {
      std::map<std::string, at::Tensor> feeds;
      for (std::size_t k = 0; k < b->inputs.size(); ++k) feeds[qm_.graph().inputs[k].name] = b->inputs[k].to(device);
      qm_.executor().run(feeds, [&](std::size_t n, std::size_t k, const at::Tensor& x) {
        if (edges.count({n, k})) qs.observe(n, k, x);
        return x;
      });
      seen += b->rows;
    }
    if (seen == 0) throw Error("target: the calibration data yielded no samples for the 16-bit observers");
    for (auto i : wide)
      if (qs.all()[i].active()) qs.finish(qs.all()[i]);
  }

  /// Puts every layer at the precision `want` says.
  void configure(const std::vector<int>& want) {
    QuantSlots& qs = qm_.quant_slots();
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (state_[l] == want[l]) continue;
      const Layer& layer = layers_[l];
      // Back to the calibrated 8-bit state first.
      if (state_[l] == kFloat) {
        for (auto s : layer.slots) qs.all()[s].enabled = true;
        for (auto s : layer.biases) qs.all()[s].enabled = bias_enabled_[s];
      } else if (state_[l] == kInt16) {
        for (auto s : layer.activations) swap_objects(qs.all()[s], int16_.at(s));
      }
      if (want[l] == kFloat) {
        for (auto s : layer.slots) qs.all()[s].enabled = false;
        for (auto s : layer.biases) qs.all()[s].enabled = false;
      } else if (want[l] == kInt16) {
        for (auto s : layer.activations) swap_objects(qs.all()[s], int16_.at(s));
      }
      for (auto s : layer.biases)
        if (qs.all()[s].enabled) qs.finish_bias(qs.all()[s]);
      state_[l] = want[l];
    }
  }

  QuantModel& qm_;
  const TargetConfig& t_;
  const TargetData& d_;
  TargetReport report_;
  std::vector<Layer> layers_;
  std::vector<std::size_t> ranked_;
  std::vector<int> state_;
  std::vector<std::vector<at::Tensor>> reference_;
  double fp32_accuracy_ = 0;
  std::map<std::size_t, bool> bias_enabled_;
  bool int16_ready_ = false;
  std::map<std::size_t, SlotObjects> int16_;  // slot -> the objects of its other precision
};

}  // namespace

TargetReport meet_target(QuantModel& qm, const TargetConfig& target, const TargetData& data,
                         const ProgressFn& progress) {
  c10::InferenceMode guard;
  for (const auto& s : qm.slots())
    if (qm.quant_slots().usable(s) && !s.calibrated)
      throw Error(s.where() + ": the accuracy target needs a calibrated model; calibrate first");
  TargetSearch search(qm, target, data);
  return search.run(progress);
}

std::string target_report_json(const TargetReport& r) {
  using nlohmann::json;
  auto rows = [](const std::vector<LayerSensitivity>& v) {
    json a = json::array();
    for (const auto& e : v) a.push_back({{"node", e.node}, {"op_type", e.op_type}, {"sqnr_db", e.sqnr_db}});
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
            {"quantized_layers", r.quantized_layers},
            {"budget", r.budget},
            {"evaluations", r.evaluations},
            {"sensitivity_seconds", r.sensitivity_seconds},
            {"seconds", r.seconds},
            {"sensitivity", rows(r.ranking)}};
  return j.dump(2);
}

}  // namespace sparsebit
