#pragma once
/// \file
/// Data-parallel gradients summed while backward runs (Note [Gradient buckets]): what `qat`
/// and `prune --finetune` use in a distributed run, for applications with their own training
/// loop over a QuantModel too.
///
///     sparsebit::GradientSync sync(*sparsebit::distributed(), model.parameters());
///     for (...) {
///       optimizer.zero_grad();
///       sync.begin_step("step " + std::to_string(i));
///       loss.backward();       // buckets are summed as their gradients arrive
///       sync.finish_step();    // every process now holds the summed gradients
///       optimizer.step();
///     }

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsebit/core/distributed.h"
#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// Note [Gradient buckets]
/// The trained tensors are grouped into buckets, in the order their gradients became ready in
/// the first step (rank 0's order, sent to all): the first bucket of about 1 MiB, the others of
/// about 25 MiB (SPARSEBIT_GRADIENT_BUCKET_MB; 0 sums everything after backward), one dtype
/// and device each. A hook on each tensor copies its gradient into its
/// bucket as backward produces it; a bucket whose gradients are all in is summed over the
/// processes at once, while backward goes on, provided every earlier bucket has started (so
/// every process starts the same sums in the same order). After backward the buckets still
/// waiting (a tensor with no gradient this step counts as zero) start, all finish, and the sums
/// become the gradients. The first step, while the order is learnt, sums everything after
/// backward in one bucket.
class SPARSEBIT_API GradientSync {
 public:
  GradientSync(Distributed& group, std::vector<at::Tensor> params);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Before backward; `what` names the step in failure messages.
  void begin_step(const std::string& what);
  /// After backward (also when this process had no samples and ran none): every process's
  /// gradients summed into each tensor's grad.
  void finish_step();
  /// Buckets in use (0 before the first step has finished).
  std::size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<std::size_t> members;  // indices into params_
    std::vector<std::int64_t> offsets;
    at::Tensor flat;
    std::size_t waiting = 0;
    bool started = false;
  };
  void arrived(std::size_t index, const at::Tensor& grad);
  void start_ready();
  void build_buckets(const std::vector<std::size_t>& order);

  Distributed& group_;
  std::vector<at::Tensor> params_;
  std::vector<unsigned> hooks_;
  std::vector<std::size_t> bucket_of_;  // param -> bucket
  std::vector<Bucket> buckets_;
  std::vector<bool> seen_;
  std::vector<std::size_t> arrival_;  // first step: the order gradients arrived in
  std::size_t next_start_ = 0;
  std::string what_;
  std::int64_t bucket_bytes_;  // after the first bucket; 0: one sum after backward
};

}  // namespace sparsebit
