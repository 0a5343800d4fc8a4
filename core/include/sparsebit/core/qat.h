#pragma once
/// \file
/// Label-free quantization-aware training by distillation: the float model is the teacher,
/// the quantized model (after QuantModel::init_qat) the student, and the loss the distance
/// between their outputs, so any model can be fine-tuned with unlabeled data only.
///
///     sparsebit::QuantModel student(sparsebit::load_onnx(path), config, registry);
///     student.init_qat(*calib);
///     sparsebit::Model float_model = sparsebit::load_onnx(path);
///     sparsebit::Executor teacher(float_model.graph, registry);
///     sparsebit::distill(student, teacher, [&] { return sparsebit::open_dataset(train, inputs); },
///                        {config.qat, "run.ckpt", fingerprint});
///
/// Note [QAT checkpoints]
/// After every epoch the student's named_parameters(), named_states() and the optimizer's state
/// are written (atomically) to the checkpoint file with the epoch count and the run's
/// fingerprint. A run
/// that finds a checkpoint with its fingerprint continues after the last finished epoch, so an
/// interruption loses at most one epoch; calibration and data order are deterministic, so the
/// result equals an uninterrupted run's. A checkpoint with another fingerprint is refused.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit {

struct QatOptions {
  QatConfig settings;
  std::string checkpoint;   ///< written after every epoch and resumed from ("": none)
  std::string fingerprint;  ///< identifies the run (model, config, data); must match to resume
  /// Called after every optimizer step (pruning keeps its zeros here). With [qat] cuda_graph it
  /// is recorded into the step's graph once: only the GPU work it queues repeats, so it must
  /// not count or read on the host (a read makes recording fail: eager steps, with a warning).
  std::function<void()> after_step;
};

struct QatEpoch {
  int epoch = 0;          ///< 1-based
  double loss = 0;        ///< mean distillation loss over the epoch's batches
  double first_loss = 0;  ///< the loss of its first step
  std::int64_t samples = 0;
  double seconds = 0;
  std::int64_t graphed_steps = 0;  ///< steps replayed from CUDA graphs ([qat] cuda_graph)
};

struct QatResult {
  int resumed_after = 0;  ///< epochs already done by an earlier run (from the checkpoint)
  std::vector<QatEpoch> epochs;
};

/// Called after every batch: epoch (1-based), samples done in it, total per epoch (-1 if
/// unknown), running mean loss.
using QatProgressFn = std::function<void(int epoch, std::int64_t done, std::int64_t total, double loss)>;

/// Distillation loss between student and teacher outputs: "mse" (mean squared error, averaged
/// over the float outputs) or "kl" (KL(teacher || student) of softmax over axis 1 at
/// `temperature`, times temperature^2, batch mean).
SPARSEBIT_API at::Tensor distillation_loss(const std::vector<at::Tensor>& student,
                                           const std::vector<at::Tensor>& teacher, const std::string& loss,
                                           double temperature);

/// Trains `student` (after init_qat) to reproduce `teacher` on the data `open_train` yields
/// (opened afresh each epoch, read in order), with Adam. See Note [QAT checkpoints].
SPARSEBIT_API QatResult distill(QuantModel& student, Executor& teacher,
                                const std::function<std::unique_ptr<Dataset>()>& open_train, const QatOptions& options,
                                const QatProgressFn& progress = {});

}  // namespace sparsebit
