#pragma once
// One epoch of distillation, shared by QAT (qat.cpp: a QuantModel learns its weights and
// quantizer parameters) and by fine-tuning after pruning (prune.cpp: a float model learns its
// weights): the same batching, teacher targets, loss, optimizer step and divergence check.

#include <ATen/core/Tensor.h>
#include <torch/optim/adam.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/gradient_sync.h"
#include "sparsebit/core/qat.h"

namespace sparsebit::detail {

struct DistillStep {
  /// The student's outputs for inputs already on the training device.
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> student;
  Executor& teacher;
  const std::vector<ValueInfo>& inputs;  ///< the model inputs the data feeds (student's and teacher's)
  at::Device device;
  const QatConfig& settings;
  torch::optim::Adam& optimizer;
  std::function<void()> after_step;  ///< e.g. re-applying pruning masks ("": nothing)
  std::string what;                  ///< "QAT" or "fine-tuning", for the divergence message
  /// Tensors training updates in place without gradients (BatchNormalization's running
  /// statistics): averaged over the processes after every step of a distributed run.
  std::vector<at::Tensor> running_states = {};
  /// A distributed run's gradient buckets (Note [Gradient buckets]): made at the first step,
  /// kept across epochs, which then reuse the bucket order it learnt.
  mutable std::shared_ptr<GradientSync> gradients = {};
  /// [qat] cache_teacher: the teacher's outputs per step of the epoch that filled the cache,
  /// with a digest of the step's inputs to notice data that change between epochs.
  struct CachedTarget {
    std::vector<at::Tensor> outputs;
    at::Tensor digest;
  };
  mutable std::vector<CachedTarget> teacher_cache = {};
  mutable int teacher_cache_epoch = 0;  ///< the epoch that filled it (0: none yet)
  /// [qat] cuda_graph: the recorded step and its fixed tensors (Note [CUDA graph steps]),
  /// kept across epochs.
  mutable std::shared_ptr<struct GraphedStep> graphed = {};
};

/// Trains one pass over the data `open_train` yields; returns the epoch's mean loss and samples
/// (seconds measured). Throws Error when the loss stops being finite. In a distributed run
/// (Note [Distributed runs]) each process takes its slice of every batch, batch statistics are
/// those of the whole batch (Note [Batch statistics over processes]), gradients are summed
/// while backward runs, losses and running statistics after it.
QatEpoch distill_epoch(const DistillStep& step, int epoch, const std::function<std::unique_ptr<Dataset>()>& open_train,
                       const QatProgressFn& progress);

}  // namespace sparsebit::detail
