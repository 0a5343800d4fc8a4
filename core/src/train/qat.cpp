// Distillation QAT (sparsebit/core/qat.h).

#include "sparsebit/core/qat.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/optim/adam.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <sstream>

#include "graph/cuda_graph.h"
#include "base/digest.h"
#include "train/distill_epoch.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/sdk/data_parallel.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit {

at::Tensor distillation_loss(const std::vector<at::Tensor>& student, const std::vector<at::Tensor>& teacher,
                             const std::string& loss, double temperature) {
  if (student.size() != teacher.size()) {
    throw Error("distillation: the student has " + std::to_string(student.size()) + " outputs, the teacher " +
                std::to_string(teacher.size()));
  }
  at::Tensor total;
  std::int64_t terms = 0;
  for (std::size_t i = 0; i < student.size(); ++i) {
    if (!student[i].is_floating_point()) continue;
    if (student[i].sizes() != teacher[i].sizes()) {
      throw Error("distillation: output " + std::to_string(i) + " has shape " + c10::str(student[i].sizes()) +
                  " in the student and " + c10::str(teacher[i].sizes()) + " in the teacher");
    }
    const at::Tensor t = teacher[i].detach().to(student[i].scalar_type());
    at::Tensor term;
    if (loss == "mse") {
      term = (student[i] - t).pow(2).mean();
    } else if (loss == "kl") {
      if (student[i].dim() < 2) throw Error("distillation: loss \"kl\" needs outputs with a class axis 1");
      const at::Tensor log_p = at::log_softmax(student[i] / temperature, 1);
      const at::Tensor q = at::softmax(t / temperature, 1);
      term = (q * (at::log(q.clamp_min(1e-12)) - log_p)).sum() / double(student[i].size(0)) * temperature * temperature;
    } else {
      throw Error("distillation: unknown loss \"" + loss + "\" (mse or kl)");
    }
    total = total.defined() ? total + term : term;
    ++terms;
  }
  if (!terms) throw Error("distillation: the model has no float output to compare");
  return total / double(terms);
}

namespace {

/// FNV-1a, 8 bytes at a time, over the parameters and Adam's state in parameter order: what a
/// checkpoint restores. Stored with it, so a file whose bytes changed after it was written (a
/// flipped bit would resume into NaN) is refused rather than trained on.
std::int64_t state_digest(const std::vector<std::pair<std::string, at::Tensor>>& params, torch::optim::Adam& adam) {
  Digest64 h;
  auto mix = [&](const void* data, std::size_t n) { h.mix(data, n); };
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    mix(c.data_ptr(), c.nbytes());
  };
  for (const auto& named : params) tensor(named.second);
  for (auto& group : adam.param_groups())
    for (auto& p : group.params()) {
      const torch::optim::AdamParamState* state = adam_state(adam, p);
      if (!state) continue;
      const std::int64_t step = state->step();
      mix(&step, sizeof step);
      tensor(state->exp_avg());
      tensor(state->exp_avg_sq());
      tensor(state->max_exp_avg_sq());
    }
  return static_cast<std::int64_t>(h.value);
}

/// The checkpoint's bytes; written to its file by the caller (on a thread, while the next
/// epoch trains).
std::string checkpoint_bytes(const std::string& fingerprint, int epoch,
                             const std::vector<std::pair<std::string, at::Tensor>>& params, torch::optim::Adam& adam) {
  torch::serialize::OutputArchive archive;
  archive.write("fingerprint", c10::IValue(fingerprint));
  archive.write("epoch", c10::IValue(static_cast<std::int64_t>(epoch)));
  torch::serialize::OutputArchive values;
  for (const auto& [name, t] : params) values.write(name, t.detach().to(at::kCPU));
  archive.write("parameters", values);
  torch::serialize::OutputArchive optimizer;
  adam.save(optimizer);  // first: it brings step counts kept on a GPU into the states hashed below
  archive.write("optimizer", optimizer);
  archive.write("digest", c10::IValue(state_digest(params, adam)));
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

/// The work of load_checkpoint, whose LibTorch errors it turns into messages.
int restore_checkpoint(const std::string& path, const std::string& fingerprint,
                       const std::vector<std::pair<std::string, at::Tensor>>& params, torch::optim::Adam& adam) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(path + ": the checkpoint is a folder, device or pipe, not a file; give a file path (--checkpoint)");
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  c10::IValue fp, epoch, digest;
  if (!archive.try_read("fingerprint", fp) || !fp.isString() || !archive.try_read("epoch", epoch) || !epoch.isInt() ||
      !archive.try_read("digest", digest) || !digest.isInt()) {
    throw Error(path + ": not a QAT checkpoint of this version; delete it or pass --restart");
  }
  if (fp.toStringRef() != fingerprint) {
    throw Error(path + ": checkpoint of another run (different model, config or data); delete it or pass --restart");
  }
  torch::serialize::InputArchive values;
  archive.read("parameters", values);
  c10::NoGradGuard no_grad;
  for (const auto& [name, t] : params) {
    at::Tensor saved;
    if (!values.try_read(name, saved) || saved.sizes() != t.sizes()) {
      throw Error(path + ": checkpoint has no parameter '" + name + "' of shape " + c10::str(t.sizes()) +
                  "; delete it or pass --restart");
    }
    t.copy_(saved);
  }
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  adam.load(optimizer);
  if (state_digest(params, adam) != digest.toInt())
    throw Error(path +
                ": its contents changed since it was written (the checksum does not match); delete it or "
                "pass --restart");
  return static_cast<int>(epoch.toInt());
}

/// Restores a checkpoint into `params` and `adam`; returns the epochs it had finished.
int load_checkpoint(const std::string& path, const std::string& fingerprint,
                    const std::vector<std::pair<std::string, at::Tensor>>& params, torch::optim::Adam& adam) {
  try {
    return restore_checkpoint(path, fingerprint, params, adam);
  } catch (const c10::Error& e) {  // LibTorch's own words, without its C++ backtrace
    throw Error(path + ": not a readable QAT checkpoint (" + printable(e.what_without_backtrace(), 200) +
                "); delete it or pass --restart");
  }
}

}  // namespace

QatResult distill(QuantModel& student, Executor& teacher, const std::function<std::unique_ptr<Dataset>()>& open_train,
                  const QatOptions& options, const QatProgressFn& progress) {
  const QatConfig& s = options.settings;
  const auto& gin = student.graph().inputs;
  const at::Device device(student.config().calibration.device);
  auto feeds_of = [&](const Batch& b) {
    std::vector<at::Tensor> student_in;
    std::map<std::string, at::Tensor> teacher_in;
    for (std::size_t i = 0; i < gin.size(); ++i) {
      student_in.push_back(b.inputs[i].to(device));
      teacher_in[gin[i].name] = student_in.back();
    }
    return std::make_pair(student_in, teacher_in);
  };

  // Quantizers that initialise on their first input (lsq's init = "lsq") do so now, before a
  // checkpoint's values are restored over them.
  {
    auto data = open_train();
    Batcher batcher(*data, gin, s.batch_size, s.count);
    auto first = batcher.next();
    if (!first) throw Error("the training data " + data->describe() + " yielded no samples");
    c10::NoGradGuard no_grad;
    const bool was_training = student.training();
    student.eval();  // running statistics untouched
    student.forward(feeds_of(*first).first);
    student.train(was_training);
  }
  const auto trained = student.named_parameters();
  if (trained.empty()) throw Error("QAT: nothing to train; call init_qat() first");
  std::vector<at::Tensor> tensors;
  for (const auto& [name, t] : trained) tensors.push_back(t);
  auto params = trained;  // what a checkpoint holds: parameters and running statistics
  for (auto& st : student.named_states()) params.push_back(st);
  student.train(true);
  FusedAdam adam(tensors, torch::optim::AdamOptions(s.lr).weight_decay(s.weight_decay));

  QatResult result;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!options.checkpoint.empty() && fs::exists(options.checkpoint, ec)) {
    result.resumed_after = load_checkpoint(options.checkpoint, options.fingerprint, params, adam);
    sdk::log_info("resuming from " + options.checkpoint + " after epoch " + std::to_string(result.resumed_after) +
                  " of " + std::to_string(s.epochs));
  }
  // On a GPU, Adam counts its steps there from the first step: no host value per step, and
  // eager steps do the arithmetic of recorded ones (Note [CUDA graph steps]).
  if (device.is_cuda()) (void)adam.count_steps_on_device();
  detail::DistillStep step{[&](const std::vector<at::Tensor>& in) { return student.forward(in); },
                           teacher,
                           gin,
                           device,
                           s,
                           adam,
                           options.after_step,
                           "QAT"};
  for (auto& st : student.named_states()) step.running_states.push_back(st.second);
  // The last checkpoint's file is written on a thread while the next epoch trains.
  std::future<void> writing;
  for (int epoch = result.resumed_after + 1; epoch <= s.epochs; ++epoch) {
    const QatEpoch e = detail::distill_epoch(step, epoch, open_train, progress);
    result.epochs.push_back(e);
    sdk::log_info("epoch " + std::to_string(epoch) + "/" + std::to_string(s.epochs) + ": loss " +
                  std::to_string(e.loss) + " over " + std::to_string(e.samples) + " samples, " +
                  std::to_string(e.seconds) + " s");
    if (!options.checkpoint.empty() && writes_outputs()) {
      std::string bytes = checkpoint_bytes(options.fingerprint, epoch, params, adam);
      if (writing.valid()) writing.get();
      writing = std::async(std::launch::async, [path = options.checkpoint, bytes = std::move(bytes)] {
        AtomicFile out(path);
        out.write(bytes);
        out.commit();
      });
    }
  }
  if (writing.valid()) writing.get();
  return result;
}

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
    sdk::log_info(what + " profile, epoch " + std::to_string(epoch) + ", per step: " + line + "; total " +
                  c10::str(std::round(total * 100) / 100) + " ms; " + std::to_string(g_dispatched.load() / steps) +
                  " ATen operators dispatched");
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
    sdk::log_warn(what + ": [qat] cuda_graph: the training step could not be recorded as a CUDA graph (" + why +
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
  bool graphs = s.cuda_graph && step.device.is_cuda();
  if (s.cuda_graph && !step.device.is_cuda()) {
    if (epoch == 1)
      sdk::log_info(step.what + ": [qat] cuda_graph applies to GPU training; training on the CPU without");
  } else if (graphs && (!cuda_graphs_supported() || group || profile.on() || !fused)) {
    if (epoch == 1)
      sdk::log_warn(step.what + ": [qat] cuda_graph is off for this run: " +
                    (!cuda_graphs_supported() ? std::string("this build has no CUDA graphs")
                     : group                  ? std::string("distributed runs sum gradients on the host's schedule")
                     : profile.on()           ? std::string("SPARSEBIT_QAT_PROFILE synchronizes inside the step")
                                              : std::string("the optimizer is not a FusedAdam")));
    graphs = false;
  }
  if (graphs && !step.graphed) step.graphed = std::make_shared<GraphedStep>();
  GraphedStep* g = graphs && !step.graphed->failed ? step.graphed.get() : nullptr;
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
                  std::to_string(s.lr) + ")");
    }
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
      std::vector<at::Tensor> student_in;
      std::map<std::string, at::Tensor> teacher_in;
      for (std::size_t i = 0; i < step.inputs.size(); ++i) {
        student_in.push_back(b->inputs[i].to(step.device));
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
      loss = distillation_loss(outputs, target, s.loss, s.temperature);
      if (group) loss = loss * share;
      loss.backward();
      profile.mark("backward");
    }
    at::Tensor value;
    if (group) {
      step.gradients->finish_step();
      // The loss and the running statistics (equal already where batch statistics are summed;
      // averaged for ops that keep their own) in one more collective.
      std::vector<at::Tensor> sums{loss.defined() ? loss.detach().reshape({1}).to(at::kFloat)
                                                  : at::zeros({1}, at::TensorOptions().device(step.device))};
      for (auto& st : step.running_states) sums.push_back(st);
      group->all_reduce_sum(sums, "loss of " + name);
      value = sums[0];
      for (auto& st : step.running_states) st.detach().div_(group->world_size());
      profile.mark("gradient and loss sums");
    } else {
      value = loss.detach();
    }
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
