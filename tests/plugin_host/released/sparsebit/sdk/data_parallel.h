#pragma once
/// \file
/// Data-parallel training seen from an op: statistics of the whole batch when every process
/// holds a slice of it.
///
/// Note [Batch statistics over processes]
/// In a data-parallel QAT or fine-tuning step (docs/DISTRIBUTED.md) each process computes on
/// its slice of every batch. An op whose training output depends on statistics of the whole
/// batch (BatchNormalization normalizing with the batch's mean and variance) sums its
/// per-process sums with sum_over_processes(): the sum is differentiable (in backward the
/// gradient reaching each process is the sum of every process's gradient of the result), so
/// the step equals one process's step on the whole batch. Every process must call it the same
/// number of times in the same order, which holds when the calls depend only on the graph.
///
///     if (sdk::training_processes() > 1) {
///       at::Tensor sums = sdk::sum_over_processes(x.sum(dims));  // then divide by the count
///     }

#include <ATen/core/Tensor.h>

#include <functional>

#include "sparsebit/sdk/export.h"

namespace sparsebit::sdk {

/// How many processes share each training batch now: 1 outside a data-parallel training step.
SPARSEBIT_API int training_processes();

/// The elementwise sum of `t` over those processes, differentiable; `t` itself when alone.
SPARSEBIT_API at::Tensor sum_over_processes(const at::Tensor& t);

/// Host side: while a data-parallel step runs, `processes` > 1 and `sum` computing the sum
/// (the core installs it for the duration of a training epoch; 1 and {} restore the default).
SPARSEBIT_API void set_process_sum(int processes, std::function<at::Tensor(const at::Tensor&)> sum);

}  // namespace sparsebit::sdk
