// The layerwise calibration runner (Note [Layerwise runner]) and layer reconstruction
// (Note [Layer reconstruction]), both in sparsebit/core/quant_model.h.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "base/log.h"
#include "base/mapped_file.h"
#include "graph/cuda_graph.h"
#include "quant/distributed_merge.h"
#include "quant/layerwise.h"
#include "quant/plugin_call.h"
#include "quant/quant_model_access.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace {

class LayerStateImpl final : public LayerState {
 public:
  LayerStateImpl(LayerwiseRunner& r, std::size_t i) : r_(r), i_(i) {}
  const Graph& graph() const override { return r_.graph(); }
  const Node& node() const override { return r_.node(i_); }
  std::size_t batches() const override { return r_.batches(); }
  at::Tensor float_output(std::size_t b, std::size_t k) const override { return r_.float_output(i_, b, k); }
  at::Tensor quantized_output(std::size_t b, std::size_t k) override {
    if (b >= r_.batches())
      throw Error("quantized_output: batch " + std::to_string(b) + " of " + std::to_string(r_.batches()));
    auto out = r_.quantized_outputs(i_, r_.source(b));
    if (k >= out.size()) throw Error(node().describe() + ": has no output " + std::to_string(k));
    return out[k];
  }
  int bias_input() const override { return r_.bias_input(i_); }
  std::int64_t bias_axis() const override {
    const int k = bias_input();
    if (k < 0) throw Error(node().describe() + ": has no bias");
    const std::int64_t c = r_.graph().initializers.at(node().inputs[static_cast<std::size_t>(k)]).numel();
    const at::Tensor y = r_.float_output(i_, 0, 0);
    if (y.dim() >= 2 && y.size(1) == c) return 1;
    if (y.dim() >= 1 && y.size(-1) == c) return y.dim() - 1;
    throw Error(node().describe() + ": its bias of " + std::to_string(c) +
                " values matches no channel axis of its output " + c10::str(y.sizes()));
  }
  void set_bias(const at::Tensor& value) override { r_.set_bias(i_, value); }

 private:
  LayerwiseRunner& r_;
  std::size_t i_;
};

}  // namespace

std::vector<at::Tensor> LayerwiseRunner::raw_inputs(std::size_t i, const Values& values) const {
  const Node& n = *nodes_[i];
  const auto& constants = ex_.constants();
  std::vector<at::Tensor> inputs(n.inputs.size());
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    if (n.inputs[k].empty()) continue;
    auto c = constants.find(n.inputs[k]);
    inputs[k] = c != constants.end() ? c->second : values.at(n.inputs[k]);
  }
  return inputs;
}

at::Tensor LayerwiseRunner::float_output(std::size_t i, std::size_t b, std::size_t k) const {
  const Node& n = *nodes_[i];
  if (b >= fp_.size()) throw Error("float_output: batch " + std::to_string(b) + " of " + std::to_string(fp_.size()));
  if (k >= n.outputs.size() || n.outputs[k].empty()) throw Error(n.describe() + ": has no output " + std::to_string(k));
  return fp_[b].at(n.outputs[k]);
}

std::vector<at::Tensor> LayerwiseRunner::quantized_outputs(std::size_t i, const Values& values) {
  auto inputs = raw_inputs(i, values);
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].defined()) inputs[k] = slots_.apply(i, k, inputs[k], /*force=*/true);
  Executor::InputHook in_bodies;  // nodes nested under a control-flow node: their own quantizers
  if (auto [first, last] = ex_.nested_range(i); first < last)
    in_bodies = [this](std::size_t n, std::size_t k, const at::Tensor& x) { return slots_.apply(n, k, x, true); };
  return ex_.run_node(i, inputs, ex_.scope_of(i, values), in_bodies);
}

// Note [Calibrating control-flow bodies]
// The nodes nested under an If, Loop or Scan run inside it, not one by one: their activation
// observers are fed while the node runs over the float stream (at every iteration of a loop),
// and their quantizers are set when it has seen every batch, before the node's quantized output
// is computed. They learn no reconstruction and run no layer passes: both need a node's inputs
// and outputs cached over all batches, which a loop body's change at every iteration.
void LayerwiseRunner::finish_nested(std::size_t i) {
  const auto [first, last] = ex_.nested_range(i);
  for (std::size_t j = first; j < last; ++j)
    if (const QuantSlot* w = slots_.finish_node(j))
      logs::warn("{}",
                 w->where() + " (inside " + nodes_[i]->describe() + "): quantizer '" + w->quantizer_name +
                     "' learns from its layer's cached data, which control-flow bodies do not keep; its weight is "
                     "rounded to nearest");
}

int LayerwiseRunner::bias_input(std::size_t i) const {
  const Node& n = *nodes_[i];
  const auto specs = ex_.modules()[i].module->input_specs();
  for (std::size_t k = 0; k < specs.size() && k < n.inputs.size(); ++k) {
    if (specs[k].role != InputRole::kBias || !n.has_input(k)) continue;
    auto init = graph().initializers.find(n.inputs[k]);
    if (init != graph().initializers.end() && init->second.dim() == 1 && init->second.is_floating_point())
      return static_cast<int>(k);
  }
  return -1;
}

void LayerwiseRunner::set_bias(std::size_t i, const at::Tensor& value) {
  const int k = bias_input(i);
  if (k < 0) throw Error(nodes_[i]->describe() + ": set_bias on a node without a constant bias");
  QuantModelAccess::set_constant_input(qm_, i, static_cast<std::size_t>(k), value);
}

void LayerwiseRunner::run_layer_passes(std::size_t i, CalibrationStats& stats) {
  for (auto& lp : QuantModelAccess::layer_passes(qm_)) {
    LayerStateImpl state(*this, i);
    PassContext ctx{lp.options};
    bool changed = false;
    try {
      changed = lp.pass->run_layer(state, ctx);
    } catch (const Error& e) {
      throw Error("pass '" + lp.name + "' (plugin '" + lp.plugin + "') at " + nodes_[i]->describe() + ": " + e.what());
    } catch (const c10::Error& e) {
      throw Error("pass '" + lp.name + "' (plugin '" + lp.plugin + "') failed at " + nodes_[i]->describe() + ": " +
                  e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw Error("pass '" + lp.name + "' (plugin '" + lp.plugin + "') failed at " + nodes_[i]->describe() + ": " +
                  e.what());
    }
    if (changed) stats.layer_pass_changes.push_back(lp.name + ": " + nodes_[i]->name);
  }
}

void LayerwiseRunner::release(std::size_t i) {
  const Node& n = *nodes_[i];
  for (const auto& name : n.inputs)  // the layer is done: its mapped weights may leave memory
    if (auto c = ex_.constants().find(name); c != ex_.constants().end()) page_out(c->second);
  auto drop = [&](const std::string& name) {
    for (auto& v : fp_) v.erase(name);
    for (auto& v : q_) v.erase(name);
  };
  for (const auto& name : n.inputs) {
    auto it = counts_.find(name);
    if (it != counts_.end() && --it->second == 0 && !outputs_.count(name)) drop(name);
  }
  for (const auto& name : n.outputs)
    if (!name.empty() && !counts_.count(name) && !outputs_.count(name)) drop(name);
}

void LayerwiseRunner::account(CalibrationStats& stats) const {
  std::size_t tensors = 0;
  std::int64_t bytes = 0;
  auto size_of = [](const at::Tensor& t) {  // a sequence counts its elements
    std::int64_t n = 0;
    if (!t.defined()) return n;
    if (!t.is_nested()) return static_cast<std::int64_t>(t.nbytes());
    for (const auto& e : t.unbind()) n += static_cast<std::int64_t>(e.nbytes());
    return n;
  };
  for (std::size_t b = 0; b < fp_.size(); ++b) {
    for (const auto& [name, t] : fp_[b]) {
      ++tensors;
      bytes += size_of(t);
    }
    if (!asym_) continue;
    for (const auto& [name, t] : q_[b]) {
      auto f = fp_[b].find(name);
      if (f != fp_[b].end() && f->second.is_same(t)) continue;  // shared, counted once
      ++tensors;
      bytes += size_of(t);
    }
  }
  stats.peak_cached_tensors = std::max(stats.peak_cached_tensors, tensors);
  stats.peak_cached_bytes = std::max(stats.peak_cached_bytes, bytes);
}

/// Reads the calibration data into the float stream's cache (and the quantized stream's, which
/// shares its tensors until the streams diverge); counts samples and batches.
void LayerwiseRunner::cache_batches(CalibrationStats& stats) {
  const auto& gin = qm_.graph().inputs;
  const auto& cal = qm_.config().calibration;
  const at::Device device(cal.device);
  Batcher batcher(data_, gin, cal.batch_size, cal.count);
  // Note [Distributed runs]: process r caches batches r, r + W, ...; states merge at each node.
  group_ = dividing_group(slots_, !QuantModelAccess::layer_passes(qm_).empty(), false);
  Prefetcher ahead(batcher, [this](std::int64_t i) {
    return BatchShare{0, 1, group_ && i % group_->world_size() != group_->rank()};
  });
  while (auto b = ahead.next()) {
    if (b->held == 0) {  // another process's batch
      stats.samples += b->rows;
      ++stats.batches;
      continue;
    }
    Values feeds;
    for (std::size_t k = 0; k < gin.size(); ++k) feeds[gin[k].name] = b->inputs[k].to(device);
    if (asym_) q_.push_back(feeds);  // shares the tensors until the streams diverge
    fp_.push_back(std::move(feeds));
    rows_.push_back(b->rows);
    stats.samples += rows_.back();
    ++stats.batches;
  }
  if (stats.samples == 0) throw Error("the calibration data " + data_.describe() + " yielded no samples");
  if (group_)
    logs::info("{}", "this process caches " + std::to_string(fp_.size()) + " of the " + std::to_string(stats.batches) +
                         " calibration batches");
}

/// The quantized stream past node `i`: where the node sees exactly what the float stream gave
/// it, its output is shared too; otherwise it runs with its quantizers.
void LayerwiseRunner::run_quantized_stream(std::size_t i) {
  const Node& n = *nodes_[i];
  const auto [first, last] = ex_.nested_range(i);
  for (std::size_t b = 0; b < q_.size(); ++b) {
    auto raw = raw_inputs(i, q_[b]);
    bool same = first == last;  // quantizers inside bodies change the output
    for (std::size_t k = 0; k < raw.size() && same; ++k) {
      if (!raw[k].defined()) continue;
      if (!ex_.constants().count(n.inputs[k]) && !raw[k].is_same(fp_[b].at(n.inputs[k]))) same = false;
      else if (!slots_.apply(i, k, raw[k], /*force=*/true).is_same(raw[k])) same = false;
    }
    if (same) {
      for (const auto& o : n.outputs)
        if (!o.empty() && fp_[b].count(o)) q_[b][o] = fp_[b][o];
      continue;
    }
    auto out = quantized_outputs(i, q_[b]);
    for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
      if (!n.outputs[k].empty()) q_[b][n.outputs[k]] = std::move(out[k]);
  }
}

CalibrationStats LayerwiseRunner::run() {
  // Plain tensors, not inference tensors: reconstruction trains through cached values.
  c10::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  CalibrationStats stats;
  stats.mode = qm_.config().calibration.mode;
  const auto& cal = qm_.config().calibration;
  const at::Device device(cal.device);
  const std::int64_t total = cal.count > 0 ? cal.count : data_.num_samples().value_or(-1);
  cache_batches(stats);
  counts_ = ex_.use_counts();
  for (const auto& o : qm_.graph().outputs) outputs_.insert(o.name);
  account(stats);

  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = *nodes_[i];
    auto store = [&](Values& values, std::vector<at::Tensor>& out) {
      for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
        if (!n.outputs[k].empty()) values[n.outputs[k]] = std::move(out[k]);
    };
    const auto [first, last] = ex_.nested_range(i);
    Executor::InputHook observe_nested;  // Note [Calibrating control-flow bodies]
    if (first < last)
      observe_nested = [this](std::size_t n, std::size_t k, const at::Tensor& x) {
        slots_.observe(n, k, x);
        return x;
      };
    for (std::size_t b = 0; b < fp_.size(); ++b) {
      auto out = ex_.run_node(i, raw_inputs(i, fp_[b]), ex_.scope_of(i, fp_[b]), observe_nested);
      store(fp_[b], out);
    }
    for (std::size_t b = 0; b < fp_.size(); ++b) {
      const auto inputs = raw_inputs(i, source(b));
      for (std::size_t k = 0; k < inputs.size(); ++k)
        if (inputs[k].defined()) slots_.observe(i, k, inputs[k]);
    }
    if (group_) {
      std::vector<QuantSlot*> here;
      std::vector<std::size_t> flat{i};  // the node and those nested in it
      for (std::size_t j = first; j < last; ++j) flat.push_back(j);
      for (std::size_t j : flat)
        for (std::size_t k = 0; k < ex_.flat_node(j).inputs.size(); ++k)
          if (QuantSlot* s = slots_.at(j, k)) here.push_back(s);
      merge_observers(*group_, here, device, "merging observer states of " + n.name);
    }
    if (QuantSlot* learnt = slots_.finish_node(i)) {
      if (learnt->reconstructed()) reconstruct(i, *learnt, stats);
      else solve_weight(i, *learnt, stats);
    }
    finish_nested(i);
    run_layer_passes(i, stats);

    if (asym_) run_quantized_stream(i);
    account(stats);
    release(i);
    if (progress_)
      progress_(static_cast<std::int64_t>(i + 1) * stats.samples / static_cast<std::int64_t>(nodes_.size()), total);
  }
  for (auto& lp : QuantModelAccess::layer_passes(qm_)) {
    auto unused = lp.options.unused();
    if (!unused.empty()) {
      throw Error(qm_.config().source + ": [passes." + lp.name + "] key " + unused.front() +
                  " is not read by this pass");
    }
  }
  stats.seconds = seconds_since(start);
  return stats;
}

CalibrationStats run_layerwise(QuantModel& qm, Dataset& data, const ProgressFn& progress) {
  return LayerwiseRunner(qm, data, progress).run();
}

}  // namespace sparsebit
