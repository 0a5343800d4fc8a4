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

#include "graph/cuda_graph.h"
#include "quant/distributed_merge.h"
#include "quant/layerwise.h"
#include "base/mapped_file.h"
#include "quant/plugin_call.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

using Values = std::map<std::string, at::Tensor>;

class LayerwiseRunner {
 public:
  LayerwiseRunner(QuantModel& qm, Dataset& data, const ProgressFn& progress)
      : qm_(qm),
        slots_(qm.quant_slots()),
        ex_(qm.executor()),
        data_(data),
        progress_(progress),
        asym_(qm.config().calibration.mode == "asym"),
        nodes_(qm.graph().nodes()) {}

  CalibrationStats run();

  // For LayerState.
  const Graph& graph() const { return qm_.graph(); }
  const Node& node(std::size_t i) const { return *nodes_[i]; }
  std::size_t batches() const { return fp_.size(); }
  const Values& source(std::size_t b) const { return asym_ ? q_[b] : fp_[b]; }
  at::Tensor float_output(std::size_t i, std::size_t b, std::size_t k) const;
  std::vector<at::Tensor> quantized_outputs(std::size_t i, const Values& values);
  int bias_input(std::size_t i) const;
  void set_bias(std::size_t i, const at::Tensor& value);

 private:
  /// Node i's inputs as stored: constants, cached values of `values`, undefined where omitted.
  std::vector<at::Tensor> raw_inputs(std::size_t i, const Values& values) const;
  void finish_nested(std::size_t i);
  struct RecordedStep;
  void reconstruct(std::size_t i, QuantSlot& w, CalibrationStats& stats);
  void solve_weight(std::size_t i, QuantSlot& w, CalibrationStats& stats);
  /// Node i's output error against the float model's over the cached batches, its weight
  /// slot `w` as its quantizer gives it now and the other inputs as the runner feeds them.
  double output_mse(std::size_t i, QuantSlot& w);
  void run_layer_passes(std::size_t i, CalibrationStats& stats);
  void release(std::size_t i);
  void account(CalibrationStats& stats) const;

  QuantModel& qm_;
  QuantSlots& slots_;
  Executor& ex_;
  Dataset& data_;
  const ProgressFn& progress_;
  const bool asym_;
  const std::vector<const Node*> nodes_;
  std::vector<Values> fp_, q_;      // per batch: float stream, quantized stream (asym only)
  std::vector<std::int64_t> rows_;  // samples in each batch
  std::map<std::string, int> counts_;
  std::set<std::string> outputs_;
  Distributed* group_ = nullptr;  // set when the batches are divided between processes
};

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

/// The reconstruction loss: squared error summed over channels (dim 1), averaged over the rest.
at::Tensor reconstruction_loss(const at::Tensor& y, const at::Tensor& target) {
  const at::Tensor d = (y - target).pow(2);
  return d.dim() >= 2 ? d.sum(1).mean() : d.mean();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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
      sdk::log_warn(w->where() + " (inside " + nodes_[i]->describe() + "): quantizer '" + w->quantizer_name +
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
  qm_.set_constant_input(i, static_cast<std::size_t>(k), value);
}

namespace {

/// The samples of every reconstruction step, drawn on the host in the order the steps take
/// them (so the same draws as one step at a time) a chunk of steps ahead and copied to the
/// device once per chunk: a step on a GPU copies nothing from pageable host memory, which would
/// make the host wait for the GPU's queued work.
class StepDraws {
 public:
  StepDraws(const std::vector<std::int64_t>& rows, bool by_rows, std::int64_t draw, std::uint64_t seed,
            const at::Device& device)
      : rows_(rows), by_rows_(by_rows), draw_(draw), rng_(seed), pick_(rows.begin(), rows.end()), device_(device) {}

  struct Draw {
    std::size_t batch = 0;
    at::Tensor rows;  ///< undefined: the whole batch
  };

  /// The next step's draw.
  Draw next() {
    if (next_ == batches_.size()) refill();
    Draw d{batches_[next_], {}};
    if (offsets_[next_] >= 0) d.rows = chunk_.narrow(0, offsets_[next_], draw_);
    ++next_;
    return d;
  }

 private:
  static constexpr std::size_t kChunkSteps = 1024;

  void refill() {
    batches_.clear();
    offsets_.clear();
    next_ = 0;
    std::vector<std::int64_t> all, picked;
    for (std::size_t k = 0; k < kChunkSteps; ++k) {
      const std::size_t b = pick_(rng_);
      batches_.push_back(b);
      if (!by_rows_ || rows_[b] <= draw_) {
        offsets_.push_back(-1);
        continue;
      }
      all.resize(static_cast<std::size_t>(rows_[b]));
      std::iota(all.begin(), all.end(), 0);
      for (std::int64_t j = 0; j < draw_; ++j) {  // partial Fisher-Yates
        std::uniform_int_distribution<std::int64_t> d(j, rows_[b] - 1);
        std::swap(all[static_cast<std::size_t>(j)], all[static_cast<std::size_t>(d(rng_))]);
      }
      offsets_.push_back(static_cast<std::int64_t>(picked.size()));
      picked.insert(picked.end(), all.begin(), all.begin() + draw_);
    }
    if (!picked.empty()) chunk_ = at::tensor(picked, at::kLong).to(device_);
  }

  const std::vector<std::int64_t>& rows_;
  const bool by_rows_;
  const std::int64_t draw_;
  std::mt19937_64 rng_;
  std::discrete_distribution<std::size_t> pick_;
  const at::Device device_;
  std::vector<std::size_t> batches_;
  std::vector<std::int64_t> offsets_;  // into chunk_, -1 for a whole batch
  std::size_t next_ = 0;
  at::Tensor chunk_;
};

}  // namespace

// Note [Recorded reconstruction steps]: the fixed tensors a recorded step reads and writes.
struct LayerwiseRunner::RecordedStep {
  static constexpr int kEagerSteps = 3;  // before recording (cuDNN's algorithms, Adam's state)
  detail::StepGraph graph;
  bool failed = false;
  std::vector<at::Tensor> inputs;  // per node input: the step's samples; undefined for constants
  at::Tensor target, step;
};

void LayerwiseRunner::reconstruct(std::size_t i, QuantSlot& w, CalibrationStats& stats) {
  const Node& n = *nodes_[i];
  const auto t0 = std::chrono::steady_clock::now();
  const ReconstructionSettings settings = *w.quantizer->reconstruction();
  const at::Tensor weight = ex_.constants().at(w.tensor);
  const auto& constants = ex_.constants();
  const at::Device device = weight.device();

  // Samples are drawn row by row where every cached input and the target count samples along
  // dim 0; otherwise a step takes one whole cached batch.
  bool by_rows = true;
  for (std::size_t b = 0; b < fp_.size() && by_rows; ++b) {
    const at::Tensor& t = fp_[b].at(n.outputs[0]);
    by_rows = t.dim() >= 1 && t.size(0) == rows_[b];
    for (const auto& name : n.inputs)
      if (!name.empty() && !constants.count(name)) {
        const at::Tensor& x = source(b).at(name);
        by_rows = by_rows && x.dim() >= 1 && x.size(0) == rows_[b];
      }
  }
  // A step's samples of a cached tensor: `rows` along dim 0, or all of it.
  auto sample_sizes = [](const at::Tensor& x, const at::Tensor& rows) {
    std::vector<std::int64_t> sizes = x.sizes().vec();
    if (rows.defined()) sizes[0] = rows.size(0);
    return sizes;
  };
  auto gather = [](const at::Tensor& x, const at::Tensor& rows, at::Tensor* into) {
    if (!into) return rows.defined() ? x.index_select(0, rows) : x;
    if (rows.defined()) at::index_select_out(*into, x, 0, rows);
    else into->copy_(x);
    return *into;
  };
  auto output_with = [&](std::vector<at::Tensor> inputs) {
    {
      c10::NoGradGuard no_grad;
      for (std::size_t k = 0; k < inputs.size(); ++k)
        if (inputs[k].defined() && k != w.input_index) inputs[k] = slots_.apply(i, k, inputs[k], /*force=*/true);
    }
    inputs[w.input_index] = plugin_call(w, false, "forward", [&] { return w.quantizer->forward(weight); });
    return ex_.run_node(i, inputs).at(0);
  };
  if (group_ && fp_.empty())
    throw Error(n.describe() + ": this process has no calibration batch to reconstruct from (" +
                std::to_string(group_->world_size()) +
                " processes share the data): use fewer processes or a "
                "smaller [calibration] batch_size");
  ReconstructionReport report;
  report.node = n.name;
  report.mse_nearest = output_mse(i, w);
  plugin_call(w, false, "begin_reconstruction", [&] { w.quantizer->begin_reconstruction(weight); });
  {
    at::AutoGradMode grad(true);
    auto params = plugin_call(w, false, "parameters", [&] { return w.quantizer->parameters(); });
    if (params.empty())
      throw Error(w.where() + ": quantizer '" + w.quantizer_name + "' has nothing to reconstruct with");
    FusedAdam adam(params, torch::optim::AdamOptions(settings.learning_rate));
    // On a GPU the step count and the penalty's step live there (Note [Recorded reconstruction
    // steps]); eager and recorded steps then do the same arithmetic.
    at::Tensor device_step;
    if (device.is_cuda()) {
      device_step = at::zeros({}, at::TensorOptions(device).dtype(at::kLong));
      const bool penalty_on_device = plugin_call(w, false, "reconstruction_penalty_on_device", [&] {
        return w.quantizer->reconstruction_penalty_on_device(device_step).has_value();
      });
      if (!penalty_on_device || !adam.count_steps_on_device()) device_step = at::Tensor();
    }
    auto penalty_at = [&](std::int64_t step, const at::Tensor& on_device) {
      if (on_device.defined())
        return plugin_call(w, false, "reconstruction_penalty_on_device",
                           [&] { return *w.quantizer->reconstruction_penalty_on_device(on_device); });
      return plugin_call(w, false, "reconstruction_penalty", [&] { return w.quantizer->reconstruction_penalty(step); });
    };
    auto loss_of = [&](const std::vector<at::Tensor>& inputs, const at::Tensor& target, std::int64_t step,
                       const at::Tensor& on_device) {
      at::Tensor loss = reconstruction_loss(output_with(inputs), target);
      const at::Tensor penalty = penalty_at(step, on_device);
      return penalty.defined() ? loss + penalty : loss;
    };

    std::unique_ptr<RecordedStep> recorded;
    std::optional<detail::CaptureStream> capture_stream;  // graphs are recorded and replayed off the default stream
    if (qm_.config().calibration.cuda_graph && device.is_cuda()) {
      const std::string off = !detail::cuda_graphs_supported() ? "this build has no CUDA graphs"
                              : group_                 ? "the gradients of several processes are summed on the host"
                              : !device_step.defined() ? "quantizer '" + w.quantizer_name +
                                                             "' computes its penalty from the step on the host"
                                                       : "";
      if (off.empty()) {
        recorded = std::make_unique<RecordedStep>();
        capture_stream.emplace(device);
      } else {
        sdk::log_info(w.where() + ": [calibration] cuda_graph: reconstruction steps run eagerly: " + off);
      }
    }

    // Divided between processes: each draws its share of a step's samples from its own
    // batches (its own stream of draws), and the gradients are averaged.
    const std::int64_t draw =
        group_ ? (settings.batch_size + group_->world_size() - 1) / group_->world_size() : settings.batch_size;
    StepDraws draws(rows_, by_rows, draw, settings.seed + (group_ ? static_cast<std::uint64_t>(group_->rank()) : 0),
                    device);
    for (std::int64_t step = 0; step < settings.iterations; ++step) {
      const StepDraws::Draw d = draws.next();
      auto inputs = raw_inputs(i, source(d.batch));  // constants as they are
      const at::Tensor& cached_target = fp_[d.batch].at(n.outputs[0]);
      if (device_step.defined()) device_step.fill_(step);
      if (recorded && !recorded->failed && step >= RecordedStep::kEagerSteps) {
        RecordedStep& g = *recorded;
        bool fits = !g.graph.recorded() || g.target.sizes() == sample_sizes(cached_target, d.rows);
        for (std::size_t k = 0; k < inputs.size() && fits && g.graph.recorded(); ++k)
          fits = !g.inputs[k].defined() || g.inputs[k].sizes() == sample_sizes(inputs[k], d.rows);
        if (fits && !g.graph.recorded()) {
          g.inputs.resize(inputs.size());
          for (std::size_t k = 0; k < inputs.size(); ++k)
            if (inputs[k].defined() && !constants.count(n.inputs[k]))
              g.inputs[k] = at::empty(sample_sizes(inputs[k], d.rows), inputs[k].options());
          g.target = at::empty(sample_sizes(cached_target, d.rows), cached_target.options());
          g.step = device_step;
        }
        if (fits) {
          for (std::size_t k = 0; k < inputs.size(); ++k)
            if (g.inputs[k].defined()) gather(inputs[k], d.rows, &g.inputs[k]);
          gather(cached_target, d.rows, &g.target);
        }
        if (fits && !g.graph.recorded()) {
          // Gradients made inside the recording are the graph's own, written at every replay.
          for (auto& p : params) p.mutable_grad() = at::Tensor();
          const std::string why = g.graph.record([&] {
            std::vector<at::Tensor> in = inputs;
            for (std::size_t k = 0; k < in.size(); ++k)
              if (g.inputs[k].defined()) in[k] = g.inputs[k];
            loss_of(in, g.target, step, g.step).backward();
            adam.step();
          });
          if (!why.empty()) {
            g.failed = true;
            sdk::log_warn(w.where() + ": [calibration] cuda_graph: the reconstruction step could not be recorded (" +
                          why + "); it runs eagerly");
          }
        }
        if (fits && !g.failed) {
          g.graph.replay();
          ++report.recorded_steps;
          continue;
        }
      }
      for (std::size_t k = 0; k < inputs.size(); ++k)
        if (inputs[k].defined() && !constants.count(n.inputs[k])) inputs[k] = gather(inputs[k], d.rows, nullptr);
      const at::Tensor target = gather(cached_target, d.rows, nullptr);
      at::Tensor loss = loss_of(inputs, target, step, device_step);
      adam.zero_grad();
      loss.backward();
      if (group_) {
        std::vector<at::Tensor> grads;
        for (auto& p : params) {
          if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
          grads.push_back(p.grad());
        }
        group_->all_reduce_sum(grads, "reconstruction gradients of " + n.name);
        for (auto& g : grads) g.div_(group_->world_size());
      }
      adam.step();
    }
  }
  plugin_call(w, false, "end_reconstruction", [&] { w.quantizer->end_reconstruction(); });
  report.mse_learnt = output_mse(i, w);
  report.quantizer = w.quantizer_name;
  report.iterations = settings.iterations;
  report.seconds = seconds_since(t0);
  sdk::log_info("reconstructed " + n.describe() + ": output MSE " + std::to_string(report.mse_nearest) +
                " (round to nearest) -> " + std::to_string(report.mse_learnt) + " in " +
                std::to_string(report.iterations) + " steps" +
                (report.recorded_steps ? " (" + std::to_string(report.recorded_steps) + " replayed from a CUDA graph)"
                                       : std::string()) +
                ", " + std::to_string(report.seconds) + " s");
  stats.reconstructions.push_back(std::move(report));
}

double LayerwiseRunner::output_mse(std::size_t i, QuantSlot& w) {
  const Node& n = *nodes_[i];
  c10::NoGradGuard no_grad;
  const at::Tensor weight = ex_.constants().at(w.tensor);
  double sum = 0, count = 0;
  for (std::size_t b = 0; b < fp_.size(); ++b) {
    auto inputs = raw_inputs(i, source(b));
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k].defined() && k != w.input_index) inputs[k] = slots_.apply(i, k, inputs[k], /*force=*/true);
    inputs[w.input_index] = plugin_call(w, false, "forward", [&] { return w.quantizer->forward(weight); });
    const at::Tensor y = ex_.run_node(i, inputs).at(0);
    sum += (y - fp_[b].at(n.outputs[0])).pow(2).sum().item<double>();
    count += static_cast<double>(y.numel());
  }
  if (group_) {
    std::vector<at::Tensor> totals{at::tensor({sum, count}, at::kDouble)};
    group_->all_reduce_sum(totals, "output error of " + n.name);
    sum = totals[0][0].item<double>();
    count = totals[0][1].item<double>();
  }
  return sum / std::max(count, 1.0);
}

// Note [Weights solved from layer inputs] (quantizer.h): the node's data input, as the
// quantized model gives it, laid out as rows along the weight's reduction axis.
void LayerwiseRunner::solve_weight(std::size_t i, QuantSlot& w, CalibrationStats& stats) {
  const Node& n = *nodes_[i];
  const auto t0 = std::chrono::steady_clock::now();
  const at::Tensor weight = ex_.constants().at(w.tensor);
  std::int64_t axis = -1;  // of the weight (input 1) along which the data input (0) runs
  bool trans_a = false;
  if (weight.dim() == 2 && w.input_index == 1 && (n.op_type == "MatMul" || n.op_type == "Gemm")) {
    axis = n.op_type == "Gemm" && n.attr_int("transB", 0) ? 1 : 0;
    trans_a = n.op_type == "Gemm" && n.attr_int("transA", 0);
  }
  if (axis < 0 && w.lookup_table) {  // an embedding has no layer input to solve from
    sdk::log_info(w.where() + ": embedding table rounded to nearest (quantizer '" + w.quantizer_name +
                  "' solves the weights of MatMul and Gemm)");
    return;
  }
  if (axis < 0) {
    sdk::log_warn(w.where() + ": quantizer '" + w.quantizer_name +
                  "' solves the 2-D weights of MatMul and Gemm from their inputs; this weight (shape " +
                  c10::str(weight.sizes()) + ") is rounded to nearest");
    return;
  }
  const std::int64_t k = weight.size(axis);
  ReconstructionReport report;
  report.node = n.name;
  report.quantizer = w.quantizer_name;
  report.mse_nearest = output_mse(i, w);
  for (std::size_t b = 0; b < fp_.size(); ++b) {
    at::Tensor x = slots_.apply(i, 0, raw_inputs(i, source(b)).at(0), /*force=*/true);
    if (trans_a) x = x.t();
    if (x.size(-1) != k)
      throw Error(n.describe() + ": its input " + c10::str(x.sizes()) + " does not end in the weight's " +
                  std::to_string(k) + " features");
    const at::Tensor rows = x.reshape({-1, k});
    plugin_call(w, false, "accumulate_inputs", [&] { w.quantizer->accumulate_inputs(rows); });
  }
  if (group_) merge_quantizer_inputs(*group_, w, "merging the layer inputs of " + n.name);
  plugin_call(w, false, "solve", [&] { w.quantizer->solve(weight, axis); });
  report.mse_learnt = output_mse(i, w);
  report.seconds = seconds_since(t0);
  sdk::log_info(w.quantizer_name + " " + n.describe() + ": output MSE " + std::to_string(report.mse_nearest) +
                " (round to nearest) -> " + std::to_string(report.mse_learnt) + ", " + std::to_string(report.seconds) +
                " s");
  stats.reconstructions.push_back(std::move(report));
}

void LayerwiseRunner::run_layer_passes(std::size_t i, CalibrationStats& stats) {
  for (auto& lp : qm_.layer_passes()) {
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

CalibrationStats LayerwiseRunner::run() {
  // Plain tensors, not inference tensors: reconstruction trains through cached values.
  c10::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  CalibrationStats stats;
  stats.mode = qm_.config().calibration.mode;
  const auto& gin = qm_.graph().inputs;
  const auto& cal = qm_.config().calibration;
  const at::Device device(cal.device);
  const std::int64_t total = cal.count > 0 ? cal.count : data_.num_samples().value_or(-1);
  Batcher batcher(data_, gin, cal.batch_size, cal.count);
  // Note [Distributed runs]: process r caches batches r, r + W, ...; states merge at each node.
  group_ = dividing_group(slots_, !qm_.layer_passes().empty(), false);
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
    sdk::log_info("this process caches " + std::to_string(fp_.size()) + " of the " + std::to_string(stats.batches) +
                  " calibration batches");
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
      if (learnt->quantizer->reconstruction()) reconstruct(i, *learnt, stats);
      else solve_weight(i, *learnt, stats);
    }
    finish_nested(i);
    run_layer_passes(i, stats);

    if (asym_) {
      for (std::size_t b = 0; b < q_.size(); ++b) {
        // Where the node sees exactly what the float stream gave it, its output is shared too.
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
        store(q_[b], out);
      }
    }
    account(stats);
    release(i);
    if (progress_)
      progress_(static_cast<std::int64_t>(i + 1) * stats.samples / static_cast<std::int64_t>(nodes_.size()), total);
  }
  for (auto& lp : qm_.layer_passes()) {
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
