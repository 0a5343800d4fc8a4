// One epoch of distillation (train/distill_epoch.h): batches sliced over the processes, the
// teacher's targets (cached across epochs when asked), the loss read one step late on GPUs, the
// optimizer step eager or replayed from a recorded CUDA graph.

#include "train/distill_epoch.h"

#include <ATen/ATen.h>
#include <spdlog/fmt/fmt.h>
#include <ATen/record_function.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "base/digest.h"
#include "base/log.h"
#include "graph/cuda_graph.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/sdk/data_parallel.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/version.h"
#include "train/distill_epoch.h"

namespace sparsebit {

namespace detail {

namespace {

// Each step's loss, read one step late on a GPU: copied to pinned host memory behind an event,
// so the host queues step k + 1 while the GPU still computes step k (a read of step k's value
// at once would make the host wait for it every step). On the CPU the value is ready at once.
class LaggedLoss {
 public:
  explicit LaggedLoss(const at::Device& device) : lag_(device.is_cuda() && TORCH_VERSION_MAJOR >= 2) {}
  /// Takes this step's loss; returns the value of the one before it (this one's on the CPU).
  std::optional<double> push(const at::Tensor& loss) {
    if (!lag_) return loss.item<double>();
    std::optional<double> previous = take();
#if TORCH_VERSION_MAJOR >= 2
    host_ = at::empty({1}, at::TensorOptions().dtype(loss.scalar_type()).pinned_memory(true));
    host_.copy_(loss.detach().reshape({1}), /*non_blocking=*/true);
    const auto* cuda = c10::impl::getDeviceGuardImpl(at::kCUDA);
    event_.emplace(at::kCUDA);
    event_->record(cuda->getStream(cuda->getDevice()));
#endif
    return previous;
  }
  /// The value still held (at the end of an epoch).
  std::optional<double> take() {
    if (!event_) return std::nullopt;
#if TORCH_VERSION_MAJOR >= 2
    event_->synchronize();
#endif
    event_.reset();
    return host_.item<double>();
  }

 private:
  bool lag_;
  at::Tensor host_;
  std::optional<c10::Event> event_;
};

// TensorFloat-32 while training when [qat] tf32 asks; full FP32 again afterwards.
struct Tf32WhileTraining {
  explicit Tf32WhileTraining(bool on) : on_(on) {
    if (on_) set(true);
  }
  ~Tf32WhileTraining() {
    if (on_) set(false);
  }
  static void set(bool allow) {
    at::globalContext().setAllowTF32CuBLAS(allow);
    at::globalContext().setAllowTF32CuDNN(allow);
  }
  bool on_;
};

// Ops normalizing with batch statistics sum them over the processes during the epoch.
struct BatchStatistics {
  explicit BatchStatistics(Distributed* group) {
    if (group)
      sdk::set_process_sum(group->world_size(),
                           [group](const at::Tensor& t) { return group->sum_with_gradient(t, "batch statistics"); });
  }
  ~BatchStatistics() { sdk::set_process_sum(1, {}); }
};

// [qat] deterministic: ATen's deterministic algorithms while training (an operator without one
// is an error naming it), the previous settings afterwards.
struct DeterministicWhileTraining {
  explicit DeterministicWhileTraining(bool on) : on_(on) {
    if (!on_) return;
    auto& ctx = at::globalContext();
    was_ = {ctx.deterministicAlgorithms(), ctx.deterministicCuDNN(), ctx.benchmarkCuDNN()};
    // cuBLAS is deterministic with a fixed workspace; read when its first handle is made.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
    ctx.setDeterministicCuDNN(true);
    ctx.setBenchmarkCuDNN(false);
  }
  ~DeterministicWhileTraining() {
    if (!on_) return;
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(std::get<0>(was_), false);
    ctx.setDeterministicCuDNN(std::get<1>(was_));
    ctx.setBenchmarkCuDNN(std::get<2>(was_));
  }
  bool on_;
  std::tuple<bool, bool, bool> was_{};
};

std::atomic<std::int64_t> g_dispatched{0};  // ATen operators seen by StepProfile's callback

// SPARSEBIT_QAT_PROFILE=1: the device is synchronized between the phases of every step and
// their mean times are logged per epoch, with the ATen operators dispatched per step (the host
// cost a CUDA graph would remove). Slower than a normal run: for finding where time goes.
class StepProfile {
 public:
  StepProfile(const at::Device& device) : device_(device) {
    const char* v = std::getenv("SPARSEBIT_QAT_PROFILE");
    on_ = v && *v && std::string(v) != "0";
    if (!on_) return;
    g_dispatched.store(0);
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(+[](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
          g_dispatched.fetch_add(1, std::memory_order_relaxed);
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    last_ = std::chrono::steady_clock::now();
  }
  ~StepProfile() {
    if (on_) at::removeCallback(handle_);
  }
  bool on() const { return on_; }
  /// Ends phase `name` of the current step.
  void mark(const char* name) {
    if (!on_) return;
    if (device_.is_cuda()) (void)at::zeros({1}, at::TensorOptions().device(device_)).item<float>();
    const auto now = std::chrono::steady_clock::now();
    ms_[name] += std::chrono::duration<double, std::milli>(now - last_).count();
    if (std::find(order_.begin(), order_.end(), name) == order_.end()) order_.push_back(name);
    last_ = now;
  }
  void log(const std::string& what, int epoch, std::int64_t steps) const {
    if (!on_ || steps == 0) return;
    std::string line;
    double total = 0;
    for (const auto& n : order_) {
      const double ms = ms_.at(n) / double(steps);
      total += ms;
      line += (line.empty() ? "" : ", ") + n + " " + c10::str(std::round(ms * 100) / 100) + " ms";
    }
    logs::info("{}", what + " profile, epoch " + std::to_string(epoch) + ", per step: " + line + "; total " +
                         c10::str(std::round(total * 100) / 100) + " ms; " +
                         std::to_string(g_dispatched.load() / steps) + " ATen operators dispatched");
  }

 private:
  at::Device device_;
  bool on_ = false;
  at::CallbackHandle handle_ = 0;
  std::chrono::steady_clock::time_point last_;
  std::map<std::string, double> ms_;
  std::vector<std::string> order_;
};

/// A digest of a batch's inputs, to notice training data that change between epochs while the
/// teacher's outputs are cached.
at::Tensor digest(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> parts;
  for (const auto& x : inputs) {
    const at::Tensor d = x.to(at::kDouble);
    parts.push_back(at::stack({d.sum(), d.abs().sum(), at::scalar_tensor(double(x.numel()), d.options())}));
  }
  return at::cat(parts);
}

}  // namespace

// Note [CUDA graph steps]: the fixed tensors a recorded step reads and writes.
struct GraphedStep {
  static constexpr int kEagerSteps = 3;  // before recording (workspaces, algorithms, Adam state)
  int eager_steps = 0;
  bool failed = false;  // recording failed: eager from then on
  StepGraph teacher, train;
  std::vector<at::Tensor> inputs, target;
  at::Tensor loss;

  bool fits(const std::vector<at::Tensor>& batch) const {
    if (inputs.empty()) return true;
    for (std::size_t i = 0; i < batch.size(); ++i)
      if (batch[i].sizes() != inputs[i].sizes() || batch[i].scalar_type() != inputs[i].scalar_type()) return false;
    return true;
  }
  void give_up(const std::string& what, const std::string& why) {
    failed = true;
    logs::warn("{}", what + ": [qat] cuda_graph: the training step could not be recorded as a CUDA graph (" + why +
                         "); training continues without graphs");
  }
};

// One step through the recorded graphs (recording them the first time); false when recording
// failed, the step's work then not done (the caller runs it eagerly).
bool graphed_step(const DistillStep& step, GraphedStep& g, FusedAdam& adam, const Batch& b, std::size_t index,
                  bool cached, at::Tensor& data_changed, at::Tensor& loss) {
  const QatConfig& s = step.settings;
  if (g.inputs.empty())
    for (const auto& x : b.inputs) g.inputs.push_back(at::empty(x.sizes(), x.options().device(step.device)));
  for (std::size_t i = 0; i < b.inputs.size(); ++i) g.inputs[i].copy_(b.inputs[i], /*non_blocking=*/true);

  if (cached && index < step.teacher_cache.size() && step.teacher_cache[index].digest.defined()) {
    const auto& c = step.teacher_cache[index];
    if (g.target.empty())
      for (const auto& t : c.outputs) g.target.push_back(at::empty_like(t));
    for (std::size_t i = 0; i < c.outputs.size(); ++i) g.target[i].copy_(c.outputs[i], /*non_blocking=*/true);
    const at::Tensor differs = (digest(g.inputs) != c.digest).any();
    data_changed = data_changed.defined() ? data_changed.logical_or(differs) : differs;
  } else {
    if (!g.teacher.recorded()) {
      std::map<std::string, at::Tensor> feeds;
      for (std::size_t i = 0; i < step.inputs.size(); ++i) feeds[step.inputs[i].name] = g.inputs[i];
      const std::string why = g.teacher.record([&] {
        c10::NoGradGuard no_grad;
        auto out = step.teacher.run(feeds);
        if (g.target.empty()) {
          g.target = std::move(out);  // the graph writes these tensors at every replay
        } else {
          for (std::size_t i = 0; i < out.size(); ++i) g.target[i].copy_(out[i]);
        }
      });
      if (!why.empty()) {
        g.give_up(step.what, "in the float model: " + why);
        return false;
      }
    }
    g.teacher.replay();
    if (s.cache_teacher && !cached) {
      if (step.teacher_cache.size() <= index) step.teacher_cache.resize(index + 1);
      std::vector<at::Tensor> kept;
      for (const auto& t : g.target) kept.push_back(t.clone());
      step.teacher_cache[index] = {std::move(kept), digest(g.inputs)};
    }
  }

  if (!g.train.recorded()) {
    if (!adam.count_steps_on_device()) {
      g.give_up(step.what, "the optimizer's parameters are at different steps (a resumed checkpoint)");
      return false;
    }
    // Gradients made inside the recording are the graph's own tensors, written at every replay.
    for (auto& group : adam.param_groups())
      for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
    const std::string why = g.train.record([&] {
      const auto outputs = step.student(g.inputs);
      const at::Tensor l = distillation_loss(outputs, g.target, s.loss, s.temperature);
      l.backward();
      adam.step();
      if (step.after_step) step.after_step();
      g.loss = l.detach();
    });
    if (!why.empty()) {
      g.loss = at::Tensor();
      g.give_up(step.what, why);
      return false;
    }
  }
  g.train.replay();
  loss = g.loss;
  return true;
}

/// The recorded step this epoch replays (Note [CUDA graph steps]), or nullptr when [qat]
/// cuda_graph is off or cannot apply to this run (said once, in epoch 1).
GraphedStep* graphed_step_of(const DistillStep& step, int epoch, const StepProfile& profile, FusedAdam* fused,
                             Distributed* group) {
  const QatConfig& s = step.settings;
  bool graphs = s.cuda_graph && step.device.is_cuda();
  if (s.cuda_graph && !step.device.is_cuda()) {
    if (epoch == 1)
      logs::info("{}", step.what + ": [qat] cuda_graph applies to GPU training; training on the CPU without");
  } else if (graphs && (!cuda_graphs_supported() || group || profile.on() || !fused)) {
    if (epoch == 1)
      logs::warn("{}", step.what + ": [qat] cuda_graph is off for this run: " +
                           (!cuda_graphs_supported() ? std::string("this build has no CUDA graphs")
                            : group        ? std::string("distributed runs sum gradients on the host's schedule")
                            : profile.on() ? std::string("SPARSEBIT_QAT_PROFILE synchronizes inside the step")
                                           : std::string("the optimizer is not a FusedAdam")));
    graphs = false;
  }
  if (!graphs) return nullptr;
  if (!step.graphed) step.graphed = std::make_shared<GraphedStep>();
  return step.graphed->failed ? nullptr : step.graphed.get();
}

/// One eager step's forward and backward: the teacher's outputs (cached from epoch 1 when
/// [qat] cache_teacher, noting in `data_changed` whether the batch differs), the student's,
/// and the distillation loss (weighted by `share` when several processes split the batch).
at::Tensor eager_step(const DistillStep& step, const Batch& b, std::size_t index, bool cached, double share,
                      at::Tensor& data_changed, StepProfile& profile) {
  const QatConfig& s = step.settings;
  std::vector<at::Tensor> student_in;
  std::map<std::string, at::Tensor> teacher_in;
  for (std::size_t i = 0; i < step.inputs.size(); ++i) {
    student_in.push_back(b.inputs[i].to(step.device));
    teacher_in[step.inputs[i].name] = student_in.back();
  }
  std::vector<at::Tensor> target;
  if (cached && index < step.teacher_cache.size() && step.teacher_cache[index].digest.defined()) {
    target = step.teacher_cache[index].outputs;
    const at::Tensor differs = (digest(student_in) != step.teacher_cache[index].digest).any();
    data_changed = data_changed.defined() ? data_changed.logical_or(differs) : differs;
  } else {
    c10::NoGradGuard no_grad;
    target = step.teacher.run(teacher_in);
    if (s.cache_teacher && !cached) {
      if (step.teacher_cache.size() <= index) step.teacher_cache.resize(index + 1);
      step.teacher_cache[index] = {target, digest(student_in)};
    }
  }
  profile.mark("teacher forward");
  const auto outputs = step.student(student_in);
  profile.mark("student forward");
  at::Tensor loss = distillation_loss(outputs, target, s.loss, s.temperature);
  if (share != 1.0) loss = loss * share;
  loss.backward();
  profile.mark("backward");
  return loss;
}

/// After a step over several processes: the gradients summed, and the loss and the running
/// statistics (equal already where batch statistics are summed; averaged for ops that keep
/// their own) in one more collective; the loss of the whole batch.
at::Tensor loss_over_processes(const DistillStep& step, Distributed& group, const at::Tensor& loss,
                               const std::string& name, StepProfile& profile) {
  step.gradients->finish_step();
  std::vector<at::Tensor> sums{loss.defined() ? loss.detach().reshape({1}).to(at::kFloat)
                                              : at::zeros({1}, at::TensorOptions().device(step.device))};
  for (auto& st : step.running_states) sums.push_back(st);
  group.all_reduce_sum(sums, "loss of " + name);
  for (auto& st : step.running_states) st.detach().div_(group.world_size());
  profile.mark("gradient and loss sums");
  return sums[0];
}

QatEpoch distill_epoch(const DistillStep& step, int epoch, const std::function<std::unique_ptr<Dataset>()>& open_train,
                       const QatProgressFn& progress) {
  const QatConfig& s = step.settings;
  const auto t0 = std::chrono::steady_clock::now();
  auto data = open_train();
  Batcher batcher(*data, step.inputs, s.batch_size, s.count);
  const std::int64_t total = s.count > 0 ? s.count : data->num_samples().value_or(-1);
  Distributed* group = distributed();
  // The next batch is read while this one trains; each process reads only its slice of it.
  Prefetcher ahead(batcher, [group](std::int64_t) {
    return group ? BatchShare{group->rank(), group->world_size(), false} : BatchShare{};
  });
  QatEpoch e;
  e.epoch = epoch;
  double loss_sum = 0;
  std::int64_t batches = 0, reported = 0;
  if (group && !step.gradients) {
    std::vector<at::Tensor> params;
    for (auto& g : step.optimizer.param_groups())
      for (auto& p : g.params()) params.push_back(p);
    step.gradients = std::make_shared<GradientSync>(*group, params);
  }
  BatchStatistics batch_statistics(group);
  Tf32WhileTraining tf32(s.tf32 && step.device.is_cuda());
  DeterministicWhileTraining deterministic(s.deterministic);
  StepProfile profile(step.device);
  auto* fused = dynamic_cast<FusedAdam*>(&step.optimizer);
  GraphedStep* g = graphed_step_of(step, epoch, profile, fused, group);
  std::optional<CaptureStream> capture_stream;  // graphs are recorded and replayed off the default stream
  if (g) capture_stream.emplace(step.device);
  LaggedLoss lagged(step.device);
  const bool cached = s.cache_teacher && step.teacher_cache_epoch != 0;
  at::Tensor data_changed;         // cached teacher outputs: set where a batch differs from epoch 1's
  std::vector<std::int64_t> rows;  // samples per step, for the progress report
  auto report = [&](double value) {
    if (!std::isfinite(value)) {
      throw Error(step.what + ": the loss became " + std::to_string(value) + " in step " +
                  std::to_string(reported + 1) + " of epoch " + std::to_string(epoch) + "; lower [qat] lr (now " +
                  fmt::format("{:g}", s.lr) + ")");
    }
    if (reported == 0) e.first_loss = value;
    loss_sum += value;
    e.samples += rows[static_cast<std::size_t>(reported)];
    ++reported;
    if (progress) progress(epoch, e.samples, total, loss_sum / double(reported));
  };
  while (auto b = ahead.next()) {
    profile.mark("data");
    // This process's slice of the batch and its share of the samples (all of it alone). A
    // batch that cannot be sliced (a recurrent state) comes whole to every process: each
    // then weighs it 1 / N.
    const std::int64_t count = b->held;
    const bool whole = group && !b->sliced;
    const double share = whole ? 1.0 / group->world_size() : b->rows > 0 ? double(count) / double(b->rows) : 1.0;
    const std::string name = "step " + std::to_string(batches + 1) + " of epoch " + std::to_string(epoch);
    at::Tensor loss;
    const auto index = static_cast<std::size_t>(batches);
    // Recorded steps (Note [CUDA graph steps]) take batches of the recorded shape once the
    // eager warm-up steps are done; the optimizer step is then part of the graph.
    bool stepped = false;
    if (count > 0 && g && g->eager_steps >= GraphedStep::kEagerSteps && g->fits(b->inputs)) {
      stepped = graphed_step(step, *g, *fused, *b, index, cached, data_changed, loss);
      if (stepped) ++e.graphed_steps;
      if (g->failed) g = nullptr;
    }
    if (!stepped) step.optimizer.zero_grad();
    if (group) step.gradients->begin_step("gradients of " + name);
    if (count > 0 && !stepped) {
      if (g) ++g->eager_steps;
      loss = eager_step(step, *b, index, cached, group ? share : 1.0, data_changed, profile);
    }
    const at::Tensor value = group ? loss_over_processes(step, *group, loss, name, profile) : loss.detach();
    rows.push_back(b->rows);
    ++batches;
    const auto previous = lagged.push(value);
    if (!stepped) {
      step.optimizer.step();
      if (step.after_step) step.after_step();
    }
    profile.mark("optimizer");
    if (previous) report(*previous);
  }
  if (const auto last = lagged.take()) report(*last);
  capture_stream.reset();
  if (fused && fused->counts_steps_on_device()) fused->sync_steps();  // what a checkpoint saves
  if (data_changed.defined() && data_changed.item<bool>()) {
    throw Error(step.what + ": [qat] cache_teacher = true, but the training data of epoch " + std::to_string(epoch) +
                " differ from epoch " + std::to_string(step.teacher_cache_epoch) +
                "'s (augmented or reshuffled data?); set cache_teacher = false");
  }
  if (s.cache_teacher && step.teacher_cache_epoch == 0) step.teacher_cache_epoch = epoch;
  profile.log(step.what, epoch, batches);
  e.loss = reported ? loss_sum / double(reported) : 0;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return e;
}

}  // namespace detail

}  // namespace sparsebit
