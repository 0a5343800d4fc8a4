// Distillation QAT (sparsebit/core/qat.h).

#include "sparsebit/core/qat.h"

#include <ATen/ATen.h>
#include <spdlog/fmt/fmt.h>
#include <c10/core/GradMode.h>
#include <torch/optim/adam.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <sstream>

#include "base/digest.h"
#include "base/log.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/core/fused_adam.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "train/distill_epoch.h"

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
    logs::info("{}", "resuming from " + options.checkpoint + " after epoch " + std::to_string(result.resumed_after) +
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
    logs::info("{}", "epoch " + std::to_string(epoch) + "/" + std::to_string(s.epochs) + ": loss " +
                         std::to_string(e.loss) + " over " + std::to_string(e.samples) + " samples, " +
                         std::to_string(e.seconds) + " s");
    // Diverged: the loss ran away from where training started (a learning rate far too high
    // saturates every weight); stop before the epoch's checkpoint and the model are written.
    constexpr double kDiverged = 1000;
    if (const double start = result.epochs.front().first_loss; start > 0 && e.loss > kDiverged * start)
      throw Error("QAT diverged: epoch " + std::to_string(epoch) + "'s mean loss " + std::to_string(e.loss) +
                  " is more than " + std::to_string(int(kDiverged)) + " times its first step's (" +
                  std::to_string(start) + "); nothing was written: lower [qat] lr (now " + fmt::format("{:g}", s.lr) +
                  ")" + (options.checkpoint.empty() ? "" : ", or resume from the last checkpoint with a lower one"));
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

}  // namespace sparsebit
