#pragma once
// The accuracy target's search (Note [Accuracy target] in sparsebit/core/target.h): its layers,
// remedies and their objects. The search is target.cpp; preparing the remedies' objects is
// target_remedies.cpp.

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/target.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::target_detail {

/// Per-layer remedies, cheapest first (Note [Accuracy target] in target.h).
enum Remedy { kNone = 0, kRange, kPerChannel, kInt16, kFloat, kRemedies };
inline const char* const kRemedyNames[kRemedies] = {"", "range", "per-channel", "int16", "float"};
inline bool costly(int r) { return r == kInt16 || r == kFloat; }  // count against the budget
int remedy_of(const std::string& name);
inline constexpr double kUnknown = std::numeric_limits<double>::infinity();
double sqnr_db(double relative_error);

/// Float outputs only: integer outputs (indices, lengths) carry no quantization error to measure.
/// Kept in their shapes: argmax-agreement reads the last axis.
inline std::vector<at::Tensor> float_outputs(const std::vector<at::Tensor>& outs) {
  std::vector<at::Tensor> r;
  for (const auto& o : outs)
    if (o.defined() && o.is_floating_point()) r.push_back(o.detach().to(at::kDouble));
  return r;
}

/// Error sums of quantized against float outputs, sample by sample.
struct Agreement {
  double sse = 0, ff = 0, worst_cosine = 1, maxabs = 0;
  std::int64_t n = 0;
  std::int64_t positions = 0, agreeing = 0;   // argmax-agreement: class positions, and those that agree
  std::optional<std::int64_t> ctc_blank;      // ctc-agreement, when measured: the blank's class
  std::int64_t sequences = 0, same_text = 0;  // ctc-agreement: sequences, and those decoded alike
  void add(const std::vector<at::Tensor>& f, const std::vector<at::Tensor>& q) {
    if (f.size() != q.size()) throw Error("target: the quantized model gave other outputs than the float one");
    double s_sse = 0, s_ff = 0, s_qq = 0, s_fq = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i].sizes() != q[i].sizes()) throw Error("target: an output changed shape between float and quantized runs");
      const at::Tensor d = q[i] - f[i];
      s_sse += d.pow(2).sum().item<double>();
      // NaN anywhere counts as the largest difference, never as none.
      if (d.numel() > 0)
        maxabs = std::max(maxabs, d.isnan().any().item<bool>() ? kUnknown : d.abs().max().item<double>());
      s_ff += f[i].pow(2).sum().item<double>();
      s_qq += q[i].pow(2).sum().item<double>();
      s_fq += (f[i] * q[i]).sum().item<double>();
      n += f[i].numel();
      if (f[i].dim() > 0 && f[i].size(-1) >= 2) {
        // A position with NaN among its entries never agrees (argmax would pick the NaN).
        const at::Tensor same = (q[i].argmax(-1) == f[i].argmax(-1)).logical_and_(q[i].isnan().any(-1).logical_not());
        agreeing += same.sum().item<std::int64_t>();
        positions += same.numel();
        if (ctc_blank) add_ctc(f[i], q[i]);
      }
    }
    const double cosine = s_ff > 0 && s_qq > 0 ? s_fq / std::sqrt(s_ff * s_qq) : (s_sse == 0 ? 1.0 : 0.0);
    worst_cosine = std::min(worst_cosine, cosine);
    sse += s_sse;
    ff += s_ff;
  }
  /// Greedy CTC decodings of f and q compared sequence by sequence (Note [Accuracy target]).
  void add_ctc(const at::Tensor& f, const at::Tensor& q) {
    const std::int64_t classes = f.size(-1);
    const std::int64_t blank = *ctc_blank < 0 ? classes + *ctc_blank : *ctc_blank;
    if (blank < 0 || blank >= classes)
      throw Error("target ctc-agreement: ctc_blank " + std::to_string(*ctc_blank) + " is not a class of an output of " +
                  std::to_string(classes) + " classes");
    std::vector<std::int64_t> outer;  // the axes before the classes that are longer than 1
    for (std::int64_t d = 0; d + 1 < f.dim(); ++d)
      if (f.size(d) > 1) outer.push_back(f.size(d));
    const std::int64_t steps = outer.empty() ? 1 : outer.back();
    const std::int64_t n = f.numel() / (steps * classes);
    const at::Tensor fs = f.reshape({n, steps, classes}).argmax(-1).cpu(), qs = q.reshape({n, steps, classes});
    const at::Tensor qa = qs.argmax(-1).cpu(), q_nan = qs.isnan().any(-1).any(-1).cpu();
    auto decode = [blank](const std::int64_t* p, std::int64_t len) {
      std::vector<std::int64_t> text;
      for (std::int64_t t = 0; t < len; ++t)
        if (p[t] != blank && (t == 0 || p[t] != p[t - 1])) text.push_back(p[t]);
      return text;
    };
    for (std::int64_t s = 0; s < n; ++s) {
      const bool same = !q_nan[s].item<bool>() &&
                        decode(fs[s].data_ptr<std::int64_t>(), steps) == decode(qa[s].data_ptr<std::int64_t>(), steps);
      same_text += same ? 1 : 0;
    }
    sequences += n;
  }
  double sqnr_db() const { return sse > 0 ? 10 * std::log10(ff / sse) : 999.0; }
  double metric(const std::string& m) const {
    if (m == "cosine") return worst_cosine;
    if (m == "sqnr") return sqnr_db();
    if (m == "maxabs") return maxabs;
    if (m == "argmax-agreement" || m == "ctc-agreement") {
      const bool ctc = m == "ctc-agreement";
      const std::int64_t total = ctc ? sequences : positions, same = ctc ? same_text : agreeing;
      if (total == 0)
        throw Error("target " + m +
                    ": no measured output has a class axis (a last dimension of 2 or more); choose the outputs "
                    "with --target-outputs, or use maxabs or cosine");
      return static_cast<double>(same) / static_cast<double>(total);
    }
    return n > 0 ? sse / static_cast<double>(n) : 0;  // mse
  }
};

struct Layer {
  std::size_t node = 0;
  std::vector<std::size_t> slots;        // non-bias slots in use
  std::vector<std::size_t> activations;  // of those, the activation slots
  std::vector<std::size_t> biases;
  /// The layer's own output error against float under each remedy (Note [Relative layer
  /// error]): kUnknown where the remedy does not apply or could not be measured.
  std::array<double, kRemedies> error{kUnknown, kUnknown, kUnknown, kUnknown, 0.0};
};

/// A slot's remedy-dependent objects, swapped in and out as a layer changes remedy.
struct SlotObjects {
  QSpec spec;
  std::unique_ptr<Observer> observer;
  std::unique_ptr<Quantizer> quantizer;
  bool calibrated = false;
  std::string range;
};

void swap_objects(QuantSlot& s, SlotObjects& o);

SlotObjects take(QuantSlot& s);
void put(QuantSlot& s, SlotObjects&& o);

class TargetSearch {
 public:
  TargetSearch(QuantModel& qm, const TargetConfig& t, const TargetData& d) : qm_(qm), t_(t), d_(d) {
    for (const auto& name : t_.fallback) ladder_.push_back(remedy_of(name));
  }
  TargetReport run(const ProgressFn& progress);

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  bool meets(double v) const { return t_.higher_is_better() ? v >= t_.value : v <= t_.value; }
  bool better(double a, double b) const { return t_.higher_is_better() ? a > b : a < b; }

  LayerSensitivity sensitivity(std::size_t l) const;
  void collect_layers();
  /// Float outputs of every held-out sample, and the float top-1 on the evaluation data.
  void cache_references();
  static at::Tensor top1(const std::vector<at::Tensor>& outs);
  at::Tensor labels(std::int64_t first, std::int64_t rows) const;
  /// The metric of the current configuration.
  double measure();
  std::map<std::string, at::Tensor> feeds(const std::vector<at::Tensor>& x) const;
  void prepare_remedies();
  /// Range remedy: a histogram observer (the `auto` observer's candidates) on every activation
  /// of every layer, streamed over the calibration data in float; then, per input, the
  /// candidate (or the range as calibrated) under which the layer's output is closest to float
  /// on the held-out samples (Note [Choosing ranges by the consuming layer]).
  void prepare_ranges();
  /// Per-channel remedy: per-tensor weights observed again per output channel, where the
  /// backend allows it.
  void prepare_per_channel();
  /// Int16 remedy: 16-bit objects for every activation slot of every layer, calibrated once on
  /// the calibration data in float. Skipped (with a warning) where the backend refuses 16 bits.
  void prepare_int16();
  void finish_biases();
  /// Streams the calibration data through the float model; `see` gets every node input.
  std::int64_t stream_calibration(const std::function<void(std::size_t, std::size_t, const at::Tensor&)>& see);
  /// Each layer's own output error under each remedy it can take, from one float pass per
  /// held-out sample: at each layer the float inputs are at hand, and the layer runs once
  /// per remedy with its weights and activations quantized as that remedy has them (biases
  /// float: their int32 grid adds nothing measurable). Nodes inside control-flow bodies are
  /// measured alike, at every run of their body.
  void measure_layers(const ProgressFn& progress);
  /// The configuration that remedies the j layers whose own error is largest: each takes the
  /// cheapest remedy of the ladder whose error is no larger than that of the first layer left
  /// as calibrated (float has none); where none does, the one that errs least.
  std::vector<int> remedied(std::size_t j) const;
  std::size_t cost(const std::vector<int>& want) const;
  /// Remedies the most erring layers, as many as the budget allows; if the target then
  /// holds, bisection finds the fewest that still hold it.
  void search(double& best, std::vector<int>& best_state);
  /// Puts every layer under the remedy `want` says.
  void configure(const std::vector<int>& want);

  QuantModel& qm_;
  const TargetConfig& t_;
  const TargetData& d_;
  std::vector<int> ladder_;
  TargetReport report_;
  std::vector<Layer> layers_;
  std::vector<std::size_t> ranked_;
  std::vector<int> state_;
  std::vector<std::vector<at::Tensor>> reference_;
  std::vector<bool> measured_;  // per graph output: whether the metric reads it (TargetConfig::outputs)
  std::vector<at::Tensor> measured(const std::vector<at::Tensor>& outs) const;
  double fp32_accuracy_ = 0;
  std::map<std::size_t, bool> bias_enabled_;
  std::array<std::map<std::size_t, SlotObjects>, kRemedies> objects_;  // [remedy][slot]: its objects
};

}  // namespace sparsebit::target_detail
