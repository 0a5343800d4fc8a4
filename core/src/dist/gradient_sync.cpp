// Data-parallel gradients summed while backward runs (Note [Gradient buckets]).

#include "sparsebit/core/gradient_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cerrno>
#include <cstdlib>

#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace {
constexpr std::int64_t kFirstBucketBytes = 1 << 20;  // starts communication early in backward

// SPARSEBIT_GRADIENT_BUCKET_MB: the size of the buckets after the first (25 MiB, as PyTorch's
// DistributedDataParallel); 0 sums everything after backward.
std::int64_t bucket_bytes() {
  const char* v = std::getenv("SPARSEBIT_GRADIENT_BUCKET_MB");
  if (!v || !*v) return std::int64_t{25} << 20;
  char* end = nullptr;
  errno = 0;
  const long mb = std::strtol(v, &end, 10);
  if (errno || *end || mb < 0 || mb > 65536)
    throw Error("environment variable SPARSEBIT_GRADIENT_BUCKET_MB='" + std::string(v).substr(0, 40) +
                "' is not a whole number of MiB from 0 to 65536");
  return std::int64_t{mb} << 20;
}
}  // namespace

GradientSync::GradientSync(Distributed& group, std::vector<at::Tensor> params)
    : group_(group), params_(std::move(params)), seen_(params_.size()), bucket_bytes_(bucket_bytes()) {
  if (bucket_bytes_ == 0) return;  // no hooks: everything after backward
  for (std::size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(params_[i].register_hook([this, i](const at::Tensor& grad) { arrived(i, grad); }));
}

GradientSync::~GradientSync() {
  for (std::size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_hook(hooks_[i]);
}

void GradientSync::begin_step(const std::string& what) {
  what_ = what;
  seen_.assign(params_.size(), false);
  for (auto& b : buckets_) {
    b.waiting = b.members.size();
    b.started = false;
  }
  next_start_ = 0;
}

void GradientSync::arrived(std::size_t index, const at::Tensor& grad) {
  if (buckets_.empty()) {  // first step: learning the order
    if (!seen_[index]) arrival_.push_back(index);
    seen_[index] = true;
    return;
  }
  Bucket& b = buckets_[bucket_of_[index]];
  if (b.started) return;  // cannot happen for a leaf (its hook runs once per backward)
  std::size_t k = 0;
  while (b.members[k] != index) ++k;
  at::Tensor slice = b.flat.narrow(0, b.offsets[k], params_[index].numel());
  c10::NoGradGuard no_grad;
  if (seen_[index]) {
    slice.add_(grad.reshape({-1}));
    return;
  }
  slice.copy_(grad.reshape({-1}));
  seen_[index] = true;
  if (--b.waiting == 0) start_ready();
}

void GradientSync::start_ready() {
  while (next_start_ < buckets_.size() && buckets_[next_start_].waiting == 0) {
    Bucket& b = buckets_[next_start_];
    group_.start_sum(b.flat, what_ + " (gradient bucket " + std::to_string(next_start_ + 1) + " of " +
                                 std::to_string(buckets_.size()) + ")");
    b.started = true;
    ++next_start_;
  }
}

void GradientSync::build_buckets(const std::vector<std::size_t>& order) {
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  std::int64_t bytes = 0;
  for (std::size_t i : order) {
    const at::Tensor& p = params_[i];
    const std::int64_t size = p.numel() * static_cast<std::int64_t>(p.element_size());
    const std::int64_t cap = buckets_.size() == 1 ? kFirstBucketBytes : bucket_bytes_;
    const bool fits = !buckets_.empty() && bytes + size <= cap &&
                      params_[buckets_.back().members.front()].scalar_type() == p.scalar_type() &&
                      params_[buckets_.back().members.front()].device() == p.device();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.members.empty() ? 0 : b.offsets.back() + params_[b.members.back()].numel());
    b.members.push_back(i);
    bucket_of_[i] = buckets_.size() - 1;
    bytes += size;
  }
  for (auto& b : buckets_) {
    const at::Tensor& last = params_[b.members.back()];
    b.flat = at::zeros({b.offsets.back() + last.numel()}, last.options().requires_grad(false));
  }
}

void GradientSync::finish_step() {
  c10::NoGradGuard no_grad;
  if (buckets_.empty()) {
    // First step: one sum after backward, then every process takes rank 0's arrival order.
    std::vector<at::Tensor> grads;
    for (auto& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    group_.all_reduce_sum(grads, what_);
    if (bucket_bytes_ == 0) return;
    std::vector<std::int64_t> order;
    if (group_.is_root()) {
      std::vector<bool> listed(params_.size());
      for (std::size_t i : arrival_) {
        order.push_back(static_cast<std::int64_t>(i));
        listed[i] = true;
      }
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (!listed[i]) order.push_back(static_cast<std::int64_t>(i));
    } else {
      order.assign(params_.size(), 0);
    }
    std::vector<at::Tensor> shared{at::tensor(order, at::kLong)};
    group_.all_reduce_sum(shared, "the order of the gradient buckets");
    std::vector<std::size_t> agreed;
    for (std::int64_t i = 0; i < shared[0].numel(); ++i)
      agreed.push_back(static_cast<std::size_t>(shared[0][i].item<std::int64_t>()));
    build_buckets(agreed);
    return;
  }
  // Buckets with a tensor that had no gradient this step: zero there, then start in order.
  for (std::size_t k = next_start_; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    for (std::size_t m = 0; m < b.members.size(); ++m) {
      if (seen_[b.members[m]]) continue;
      b.flat.narrow(0, b.offsets[m], params_[b.members[m]].numel()).zero_();
    }
    b.waiting = 0;
  }
  start_ready();
  group_.finish_sums();
  for (const auto& b : buckets_)
    for (std::size_t m = 0; m < b.members.size(); ++m) {
      at::Tensor& p = params_[b.members[m]];
      const at::Tensor sum = b.flat.narrow(0, b.offsets[m], p.numel()).view_as(p);
      if (p.grad().defined()) p.mutable_grad().copy_(sum);
      else p.mutable_grad() = sum.clone();
    }
}

}  // namespace sparsebit
