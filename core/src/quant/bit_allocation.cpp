// QuantModel::allocate_bits: per-input widths by measured sensitivity (Note [Bit allocation]).

#include "sparsebit/core/bit_allocation.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "base/log.h"
#include "quant/target_search.h"  // SlotObjects: a slot's quantizer kept while another is in place
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit {
namespace {

/// Measurements and choices: around the budget's width, then around what that chose.
constexpr int kRounds = 2;

/// A floating-point tensor (not a sequence, not indices): what an output error is measured on.
bool measurable(const at::Tensor& t) { return t.defined() && !t.is_nested() && at::isFloatingType(t.scalar_type()); }

/// The inputs one budget covers, their costs and errors, and the widths chosen for them.
struct Budget {
  std::vector<std::size_t> members;  // positions in BitAllocation::inputs
  double target = 0;
};

/// Narrows the cheapest error per bit until the budget holds, then widens back where it fits.
void choose(std::vector<AllocatedInput>& inputs, const Budget& b, const std::vector<int>& choices) {
  double total = 0, used = 0;
  for (std::size_t k : b.members) {
    inputs[k].bits = choices.back();
    total += double(inputs[k].cost);
    used += double(inputs[k].cost) * choices.back();
  }
  const double budget = b.target * total * (1 + 1e-12);
  auto step = [&](std::size_t k, int dir) -> int {  // the next width up (+1) or down (-1), or 0
    auto it = std::find(choices.begin(), choices.end(), inputs[k].bits);
    if (dir < 0) return it == choices.begin() ? 0 : *(it - 1);
    return it + 1 == choices.end() ? 0 : *(it + 1);
  };
  auto added_error = [&](std::size_t k, int from, int to) {  // measured noise may run backwards
    return std::max(0.0, inputs[k].error.at(to) - inputs[k].error.at(from));
  };
  while (used > budget) {
    std::size_t best = inputs.size();
    double best_ratio = std::numeric_limits<double>::infinity();
    for (std::size_t k : b.members) {
      const int lower = step(k, -1);
      if (!lower) continue;
      const double ratio = added_error(k, inputs[k].bits, lower) / (double(inputs[k].cost) * (inputs[k].bits - lower));
      if (best == inputs.size() || ratio < best_ratio) best = k, best_ratio = ratio;
    }
    if (best == inputs.size()) break;  // every input at the narrowest width
    const int lower = step(best, -1);
    used -= double(inputs[best].cost) * (inputs[best].bits - lower);
    inputs[best].bits = lower;
  }
  for (;;) {
    std::size_t best = inputs.size();
    double best_ratio = -1;
    for (std::size_t k : b.members) {
      const int higher = step(k, +1);
      if (!higher || used + double(inputs[k].cost) * (higher - inputs[k].bits) > budget) continue;
      const double ratio =
          added_error(k, higher, inputs[k].bits) / (double(inputs[k].cost) * (higher - inputs[k].bits));
      if (ratio > best_ratio) best = k, best_ratio = ratio;
    }
    if (best == inputs.size() || best_ratio <= 0) break;
    const int higher = step(best, +1);
    used += double(inputs[best].cost) * (higher - inputs[best].bits);
    inputs[best].bits = higher;
  }
}

double average_bits(const std::vector<AllocatedInput>& inputs, const Budget& b) {
  double total = 0, bits = 0;
  for (std::size_t k : b.members) {
    total += double(inputs[k].cost);
    bits += double(inputs[k].cost) * inputs[k].bits;
  }
  return total > 0 ? bits / total : 0;
}

}  // namespace

const BitAllocation& QuantModel::allocate_bits(const DataSource& calib, const ProgressFn& progress) {
  if (!config_.bit_allocation) throw Error(config_.source + ": allocate_bits() needs a [bit_allocation] table");
  const BitAllocationConfig& cfg = *config_.bit_allocation;
  if (calib.empty())
    throw Error(config_.source + ": [bit_allocation] measures each layer's sensitivity on calibration data; give some");
  const auto start = std::chrono::steady_clock::now();
  auto& all = slots_->all();
  BitAllocation out;
  out.weight_target = cfg.avg_weight_bits;
  out.activation_target = cfg.avg_activation_bits;
  out.choices = cfg.choices;

  // The inputs allocated: active weights, and the activations of layers whose weight is one.
  std::set<std::size_t> weighted;
  for (const auto& s : all)
    if (s.role == InputRole::kWeight && s.active()) weighted.insert(s.node_index);
  Budget weights{{}, cfg.avg_weight_bits.value_or(0)}, activations{{}, cfg.avg_activation_bits.value_or(0)};
  for (std::size_t i = 0; i < all.size(); ++i) {
    const QuantSlot& s = all[i];
    if (!s.active() || s.spec.is_float8()) continue;  // float8 inputs keep their type: widths are integer grids'
    const bool weight = s.role == InputRole::kWeight && cfg.avg_weight_bits;
    const bool activation = s.role == InputRole::kActivation && cfg.avg_activation_bits && weighted.count(s.node_index);
    if (!weight && !activation) continue;
    (weight ? weights : activations).members.push_back(out.inputs.size());
    out.inputs.push_back({i, s.node_name, s.tensor, s.role, 0, {}, s.spec.bits});
  }
  if (out.inputs.empty())
    throw Error(config_.source +
                ": [bit_allocation] finds no quantized weight, nor an activation of a layer with one, " +
                "to choose widths for");
  if (cfg.avg_activation_bits && activations.members.empty())
    logs::warn("{}", config_.source +
                         ": [bit_allocation] avg_activation_bits: no layer with a quantized weight has a " +
                         "quantized activation; only weights are allocated");

  // The samples, in calibration batches, and the float outputs and tensor shapes on them.
  const auto& gin = model_->graph.inputs;
  const at::Device device(config_.calibration.device);
  auto window = [&] { return std::make_unique<SampleWindow>(calib.open(gin), gin, 0, cfg.samples); };
  std::vector<std::vector<at::Tensor>> batches;
  {
    auto data = window();
    Batcher batcher(*data, gin, config_.calibration.batch_size, cfg.samples);
    while (auto b = batcher.next()) {
      for (auto& x : b->inputs) x = x.to(device);
      out.samples += b->inputs.empty() || b->inputs[0].dim() == 0 ? 1 : b->inputs[0].size(0);
      batches.push_back(std::move(b->inputs));
    }
  }
  if (batches.empty()) throw Error("[bit_allocation]: the calibration data " + calib.name() + " yielded no samples");
  std::vector<std::vector<at::Tensor>> reference;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  {
    at::NoGradGuard no_grad;
    set_quant(false, false);
    const ValueFn shape_of = [&](const std::string& name, const at::Tensor& v) {
      if (v.defined() && !v.is_nested()) shapes.emplace(name, v.sizes().vec());
    };
    for (std::size_t b = 0; b < batches.size(); ++b) reference.push_back(forward(batches[b], b ? ValueFn{} : shape_of));
    for (std::size_t o = 0; o < reference[0].size() && o < model_->graph.outputs.size(); ++o)
      if (measurable(reference[0][o])) shapes.emplace(model_->graph.outputs[o].name, reference[0][o].sizes().vec());
  }
  // The sensitivities are changes of the output's error: a float output that is NaN or infinite
  // has none to measure (every comparison would fail and no width would ever be chosen).
  for (std::size_t b = 0; b < reference.size(); ++b)
    for (std::size_t o = 0; o < reference[b].size(); ++o)
      if (measurable(reference[b][o]) && !at::isfinite(reference[b][o]).all().item<bool>())
        throw Error("[bit_allocation]: the float model's output '" +
                    (o < model_->graph.outputs.size() ? model_->graph.outputs[o].name : std::to_string(o)) +
                    "' is NaN or infinite on the first " + std::to_string(out.samples) + " calibration samples of " +
                    calib.name() +
                    ", so no width can be judged by the error it adds; check that the data is what the model "
                    "expects (its scale and layout), or remove [bit_allocation]");
  auto numel = [&](const std::string& name) -> std::int64_t {
    auto it = shapes.find(name);
    if (it == shapes.end()) return 1;
    return std::accumulate(it->second.begin(), it->second.end(), std::int64_t{1}, std::multiplies<>());
  };
  for (auto& in : out.inputs) {
    const QuantSlot& s = all[in.slot];
    in.cost = numel(s.tensor);
    if (s.role != InputRole::kActivation) continue;
    const Node& node = executor_->flat_node(s.node_index);
    const auto* layer = ops_.trait<WeightedLayer>(node.op_type, node.domain);
    const auto w = std::find_if(all.begin(), all.end(), [&](const QuantSlot& o) {
      return o.node_index == s.node_index && o.role == InputRole::kWeight;
    });
    if (w == all.end()) continue;
    in.cost = numel(w->tensor);  // without the shapes a layer's MACs need, its parameters stand in
    const auto y = node.outputs.empty() ? shapes.end() : shapes.find(node.outputs[0]);
    if (layer && shapes.count(s.tensor) && shapes.count(w->tensor))
      if (const std::int64_t macs =
              layer->macs(node, shapes[s.tensor], shapes[w->tensor], y == shapes.end() ? nullptr : &y->second))
        in.cost = macs;
  }

  // Each width: everything calibrated at it, and each input's quantizer kept for that width.
  std::map<int, std::vector<target_detail::SlotObjects>> at_width;
  for (int bits : cfg.choices) {
    for (const auto& in : out.inputs) {
      try {
        slots_->set_slot_bits(all[in.slot], bits);
      } catch (const Error& e) {
        throw Error(config_.source + ": [bit_allocation] choices: " + e.what());
      }
    }
    auto data = window();
    calibrate(*data);
    for (const auto& in : out.inputs) at_width[bits].push_back(target_detail::take(all[in.slot]));
  }
  // The first operating point: every allocated input at the narrowest width that meets its
  // budget; the other quantizers as configured (biases off: their scales follow inputs that
  // change). The second: the widths the first one chose.
  std::vector<int> operating(out.inputs.size());
  for (std::size_t k = 0; k < out.inputs.size(); ++k) {
    const double target = out.inputs[k].role == InputRole::kWeight ? weights.target : activations.target;
    operating[k] = *std::lower_bound(cfg.choices.begin(), cfg.choices.end(), target - 1e-9);
    target_detail::swap_objects(all[out.inputs[k].slot], at_width[operating[k]][k]);
  }
  std::vector<bool> enabled(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    enabled[i] = all[i].enabled;
    if (all[i].role == InputRole::kBias) all[i].enabled = false;
  }
  auto model_error = [&] {
    double sse = 0, ff = 0;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const auto q = forward(batches[b]);
      for (std::size_t o = 0; o < q.size(); ++o) {
        if (!measurable(q[o])) continue;
        sse += (q[o].to(at::kDouble) - reference[b][o].to(at::kDouble)).pow(2).sum().item<double>();
        ff += reference[b][o].to(at::kDouble).pow(2).sum().item<double>();
      }
    }
    const double e = ff > 0 ? sse / ff : sse;
    return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;  // NaN would win no comparison
  };
  const std::int64_t total_runs = std::int64_t(kRounds * (cfg.choices.size() - 1) * out.inputs.size());
  std::int64_t runs = 0;
  auto move_to = [&](const std::vector<int>& widths) {  // the slots to `widths` from `operating`
    for (std::size_t k = 0; k < out.inputs.size(); ++k) {
      target_detail::swap_objects(all[out.inputs[k].slot], at_width[operating[k]][k]);
      operating[k] = widths[k];
      target_detail::swap_objects(all[out.inputs[k].slot], at_width[operating[k]][k]);
    }
  };
  // Each round's choice is kept with the model's error measured under it; the lower one wins
  // (the errors of separate inputs need not add up far from where they were measured).
  std::vector<int> best;
  std::vector<std::map<int, double>> best_errors;
  double best_error = std::numeric_limits<double>::infinity();
  at::NoGradGuard no_grad;
  for (int round = 0; round <= kRounds; ++round) {
    set_quant(true, true);
    const double error = model_error();
    if (round > 0 && error < best_error) {
      best = operating, best_error = error;
      best_errors.clear();
      for (const auto& in : out.inputs) best_errors.push_back(in.error);
    }
    if (round == kRounds) break;
    // Each input at each other width, the rest at the operating point: the error it adds there.
    for (std::size_t k = 0; k < out.inputs.size(); ++k) {
      AllocatedInput& in = out.inputs[k];
      in.error.clear();
      in.error[operating[k]] = 0;
      for (int bits : cfg.choices) {
        if (bits == operating[k]) continue;
        target_detail::swap_objects(all[in.slot], at_width[operating[k]][k]);  // the operating width back to its place
        target_detail::swap_objects(all[in.slot], at_width[bits][k]);
        in.error[bits] = model_error() - error;
        target_detail::swap_objects(all[in.slot], at_width[bits][k]);
        target_detail::swap_objects(all[in.slot], at_width[operating[k]][k]);
        if (progress) progress(++runs, total_runs);
      }
    }
    if (!weights.members.empty()) choose(out.inputs, weights, cfg.choices);
    if (!activations.members.empty()) choose(out.inputs, activations, cfg.choices);
    std::vector<int> chosen;
    for (const auto& in : out.inputs) chosen.push_back(in.bits);
    move_to(chosen);
  }
  set_quant(false, false);
  if (!std::isfinite(best_error))
    throw Error("[bit_allocation]: the quantized model's output is NaN or infinite on the calibration samples of " +
                calib.name() + " at every choice of widths tried, so none can be judged; quantize without " +
                "[bit_allocation] and look at `sparsebit profile`'s per-layer error for the layer that overflows");
  for (std::size_t k = 0; k < out.inputs.size(); ++k) {
    out.inputs[k].bits = best[k];
    out.inputs[k].error = best_errors[k];
  }
  out.model_error = best_error;
  for (std::size_t i = 0; i < all.size(); ++i) all[i].enabled = enabled[i];
  for (const auto& in : out.inputs) slots_->set_slot_bits(all[in.slot], in.bits);
  out.weight_average = average_bits(out.inputs, weights);
  out.activation_average = average_bits(out.inputs, activations);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bit_allocation_ = std::move(out);
  return *bit_allocation_;
}

}  // namespace sparsebit
