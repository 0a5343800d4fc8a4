// Layer reconstruction (Note [Layer reconstruction] in sparsebit/core/quant_model.h): a
// layer's quantizer parameters fitted to its float outputs on the cached batches, by steps drawn
// ahead and optionally replayed from a recorded CUDA graph, or solved from the layer's inputs.

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
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/passes.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit {

namespace {

/// The reconstruction loss: squared error summed over channels (dim 1), averaged over the rest.
at::Tensor reconstruction_loss(const at::Tensor& y, const at::Tensor& target) {
  const at::Tensor d = (y - target).pow(2);
  return d.dim() >= 2 ? d.sum(1).mean() : d.mean();
}

}  // namespace

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
  ReconstructedByLayer& learner = *w.reconstructed();
  auto* penalty_on_device = dynamic_cast<PenaltyOnDevice*>(w.quantizer.get());
  const ReconstructionSettings settings = plugin_call(w, false, "settings", [&] { return learner.settings(); });
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
  plugin_call(w, false, "begin_reconstruction", [&] { learner.begin_reconstruction(weight); });
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
      if (!penalty_on_device || !adam.count_steps_on_device()) device_step = at::Tensor();
    }
    auto penalty_at = [&](std::int64_t step, const at::Tensor& on_device) {
      if (on_device.defined())
        return plugin_call(w, false, "reconstruction_penalty_on_device",
                           [&] { return penalty_on_device->reconstruction_penalty_on_device(on_device); });
      return plugin_call(w, false, "reconstruction_penalty", [&] { return learner.reconstruction_penalty(step); });
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
        logs::info("{}", w.where() + ": [calibration] cuda_graph: reconstruction steps run eagerly: " + off);
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
            logs::warn("{}", w.where() + ": [calibration] cuda_graph: the reconstruction step could not be recorded (" +
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
  plugin_call(w, false, "end_reconstruction", [&] { learner.end_reconstruction(); });
  report.mse_learnt = output_mse(i, w);
  report.quantizer = w.quantizer_name;
  report.iterations = settings.iterations;
  report.seconds = seconds_since(t0);
  logs::info("{}",
             "reconstructed " + n.describe() + ": output MSE " + std::to_string(report.mse_nearest) +
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
  // A layer's 2-D weight (input 1), reduced along `axis` with the features of the data input
  // (input 0), which run along its `features` axis (Note [Op traits]: WeightedLayer).
  const auto* layer = qm_.op_traits().trait<WeightedLayer>(n.op_type, n.domain);
  const auto axes = layer && w.input_index == 1 && weight.dim() == 2 ? layer->axes(n, 2) : std::nullopt;
  const std::int64_t axis = axes ? axes->weight_in : -1;
  const std::int64_t features = axes ? axes->activation : -1;
  if (axis < 0 && w.lookup_table) {  // an embedding has no layer input to solve from
    logs::info("{}", w.where() + ": embedding table rounded to nearest (quantizer '" + w.quantizer_name +
                         "' solves the weights of layers from their inputs)");
    return;
  }
  if (axis < 0) {
    logs::warn("{}", w.where() + ": quantizer '" + w.quantizer_name +
                         "' solves the 2-D weights of layers (MatMul, Gemm) from their inputs; this weight (shape " +
                         c10::str(weight.sizes()) + ") is rounded to nearest");
    return;
  }
  const std::int64_t k = weight.size(axis);
  SolvedFromInputs& solver = *w.solved();
  ReconstructionReport report;
  report.node = n.name;
  report.quantizer = w.quantizer_name;
  report.mse_nearest = output_mse(i, w);
  for (std::size_t b = 0; b < fp_.size(); ++b) {
    at::Tensor x = slots_.apply(i, 0, raw_inputs(i, source(b)).at(0), /*force=*/true);
    if (x.dim() > 0) x = x.movedim(features < 0 ? features + x.dim() : features, -1);
    if (x.size(-1) != k)
      throw Error(n.describe() + ": its input " + c10::str(x.sizes()) + " does not end in the weight's " +
                  std::to_string(k) + " features");
    const at::Tensor rows = x.reshape({-1, k});
    plugin_call(w, false, "accumulate_inputs", [&] { solver.accumulate_inputs(rows); });
  }
  if (group_) merge_quantizer_inputs(*group_, w, "merging the layer inputs of " + n.name);
  plugin_call(w, false, "solve", [&] { solver.solve(weight, axis); });
  report.mse_learnt = output_mse(i, w);
  report.seconds = seconds_since(t0);
  logs::info("{}", w.quantizer_name + " " + n.describe() + ": output MSE " + std::to_string(report.mse_nearest) +
                       " (round to nearest) -> " + std::to_string(report.mse_learnt) + ", " +
                       std::to_string(report.seconds) + " s");
  stats.reconstructions.push_back(std::move(report));
}

}  // namespace sparsebit
