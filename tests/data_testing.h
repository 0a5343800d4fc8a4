#pragma once
// In-memory calibration data for tests: one batch of a tensor, as a Dataset and as a DataSource.

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "sparsebit/core/data.h"

namespace sparsebit::testing {

/// The rows of `x` (dim 0 counts samples) as one batch.
class OneBatch final : public Dataset {
 public:
  explicit OneBatch(at::Tensor x) : x_(std::move(x)) {}
  std::string describe() const override { return "test rows"; }
  std::optional<std::int64_t> num_samples() const override { return x_.size(0); }
  std::optional<Batch> next() override {
    if (done_) return std::nullopt;
    done_ = true;
    Batch b;
    b.inputs = {x_};
    b.batched = true;
    b.source = "test rows";
    return b;
  }

 private:
  at::Tensor x_;
  bool done_ = false;
};

/// A source that opens OneBatch(x) from the first sample each time (Note [Data sources]).
inline DataSource one_batch_source(const at::Tensor& x) {
  return DataSource("test rows", [x](const std::vector<ValueInfo>&) { return std::make_unique<OneBatch>(x); });
}

}  // namespace sparsebit::testing
