// Batching: records of any dataset regrouped into batches of the size asked for and checked
// against the model's inputs (Batcher), a window of samples (SampleWindow), and batches read
// ahead on a thread (Prefetcher).

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "base/log.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

Batcher::Batcher(Dataset& data, const std::vector<ValueInfo>& inputs, std::int64_t batch_size, std::int64_t limit)
    : data_(data), inputs_(inputs), lead_(std::string::npos), batch_size_(batch_size), limit_(limit) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    scalar_.push_back(inputs[i].has_shape && inputs[i].shape.empty());
    if (!scalar_.back() && lead_ == std::string::npos) lead_ = i;
  }
  // dim 0 declared unlike the first input's (fixed 2 against a symbolic batch, or another
  // symbol): the input is not batched along dim 0.
  auto dim0 = [&](std::size_t i) -> const Dim* {
    const ValueInfo& in = inputs[i];
    return in.has_shape && !in.shape.empty() ? &in.shape[0] : nullptr;
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Dim *a = dim0(i), *b = lead_ == std::string::npos ? nullptr : dim0(lead_);
    const bool other = a && b && i != lead_ &&
                       (a->value > 0 || b->value > 0 ? a->value != b->value
                                                     : !a->param.empty() && !b->param.empty() && a->param != b->param);
    other_axis_.push_back(other);
    if (other && !whole_records_) {
      whole_records_ = true;
      logs::debug("{}", "input '" + inputs[i].name +
                            "' is not batched along dim 0; each calibration record is one batch, taken as it is");
    }
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& in = inputs[i];
    if (other_axis_[i]) continue;
    if (in.has_shape && !in.shape.empty() && in.shape[0].value == 0)
      throw Error("model input '" + in.name +
                  "' declares a batch dimension of 0: no sample fits it (re-export the model with a batch of 1 "
                  "or a named, open batch dimension)");
    // A model exported with a fixed batch (1 for most detectors with NonMaxSuppression, TF and
    // Paddle exports) cannot take larger batches: its Reshapes name the batch size.
    if (in.has_shape && !in.shape.empty() && in.shape[0].value > 0 && in.shape[0].value < batch_size_) {
      batch_size_ = in.shape[0].value;
      logs::debug("{}", "input '" + in.name + "' has a fixed batch of " + std::to_string(batch_size_) +
                            "; batches take that many samples");
    }
  }
  if (std::count(scalar_.begin(), scalar_.end(), true) > 0 && batch_size_ > 1) {
    batch_size_ = 1;  // a scalar input has no batch dimension to stack samples along
    logs::debug("{}", "the model takes a 0-d input; batches take one sample");
  }
}

namespace {

// Brings one record to the model input's rank and checks type, shape and values.
at::Tensor conform(at::Tensor t, const ValueInfo& in, const std::string& source, bool batched) {
  const std::string what = source + " (for model input '" + in.name + "')";
  if (!t.defined()) throw Error(what + ": no tensor");
  if (in.has_shape && in.shape.empty()) {  // a 0-d input: one value per record
    if (in.elem_type != 0 && onnx_type_of(t.scalar_type()) != in.elem_type)
      throw Error(what + ": data is " + dtype_name(t) + ", the model input is " + onnx_type_name(in.elem_type) +
                  "; convert the data (e.g. numpy .astype) before calibrating");
    if (t.numel() != 1)
      throw Error(what + ": the model input is a scalar (0-d), the data has shape " + c10::str(t.sizes()));
    return t.reshape({});
  }
  if (t.dim() == 0) {
    throw Error(what +
                ": holds a 0-d array (one scalar); a sample needs the model input's dimensions, at least a "
                "batch dimension (numpy.reshape(x, (1,)))");
  }
  // Half precision widens to float32 exactly: the data of a float16 model (Note [Half-precision models]).
  if (in.elem_type == 1 && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)) t = t.to(at::kFloat);
  if (in.elem_type != 0 && onnx_type_of(t.scalar_type()) != in.elem_type) {
    throw Error(what + ": data is " + dtype_name(t) + ", the model input is " + onnx_type_name(in.elem_type) +
                "; convert the data (e.g. numpy .astype) before calibrating");
  }
  if (in.has_shape) {
    const auto rank = static_cast<std::int64_t>(in.shape.size());
    if (t.dim() == rank - 1 && !batched) {
      t = t.unsqueeze(0);  // a single sample
    } else if (t.dim() != rank) {
      // Same element count per sample in another layout (e.g. IDX [N,28,28] for [N,1,28,28]).
      std::int64_t per_sample = 1;
      bool fixed = true;
      for (std::size_t i = 1; i < in.shape.size(); ++i) {
        if (in.shape[i].value < 0) fixed = false;
        else per_sample *= in.shape[i].value;
      }
      if (fixed && t.dim() >= 1 && t.numel() > 0 && t.numel() / t.size(0) == per_sample) {
        std::vector<std::int64_t> shape{t.size(0)};
        for (std::size_t i = 1; i < in.shape.size(); ++i) shape.push_back(in.shape[i].value);
        t = t.reshape(shape);
      } else {
        throw Error(what + ": data of shape " + c10::str(t.sizes()) + " does not fit the model input shape " +
                    shape_text(in.shape));
      }
    }
    for (std::size_t i = 1; i < in.shape.size(); ++i) {
      if (in.shape[i].value >= 0 && t.size(static_cast<std::int64_t>(i)) != in.shape[i].value) {
        throw Error(what + ": dimension " + std::to_string(i) + " is " +
                    std::to_string(t.size(static_cast<std::int64_t>(i))) + ", the model input needs " +
                    std::to_string(in.shape[i].value) + " (data shape " + c10::str(t.sizes()) + ")");
      }
    }
  }
  return t;
}

/// NaN and Inf in the samples a batch delivers (`first`: the index in its record of the first),
/// checked when they are delivered, so a batch another process takes is never read here.
void check_finite(const std::vector<at::Tensor>& inputs, const std::string& source, std::int64_t first) {
  for (const auto& t : inputs) {
    if (!t.is_floating_point() || t.numel() == 0 || at::isfinite(t).all().item<bool>()) continue;
    const at::Tensor rows = t.dim() == 0 ? t.reshape({1, 1}) : t.reshape({t.size(0), -1});
    auto bad = at::logical_not(at::isfinite(rows)).any(1).nonzero();
    throw Error(source + ": data contains NaN or Inf (first bad sample: " +
                std::to_string(first + bad[0].item<std::int64_t>()) + "); clean the data before calibrating");
  }
}

}  // namespace

std::int64_t Batcher::rows_of(const Part& p) const { return lead_ == std::string::npos ? 1 : p.inputs[lead_].size(0); }

std::optional<Batch> Batcher::next(const BatchShare& share) {
  auto pending_rows = [&]() {
    std::int64_t n = 0;
    for (const auto& p : pending_) n += rows_of(p);
    return n;
  };
  // Samples of other sizes (symbolic dims: text lines of different widths) never share a batch:
  // a record whose sizes differ from the pending ones waits for the next batch.
  auto same_sizes = [&](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (scalar_[i] ? !at::equal(a[i], b[i]) : a[i].sizes().slice(1) != b[i].sizes().slice(1)) return false;
    return true;
  };
  while (pending_rows() < batch_size_ && (limit_ == 0 || delivered_ + pending_rows() < limit_)) {
    Part part;
    if (held_) {
      part = std::move(*held_);
      held_.reset();
    } else {
      if (exhausted_) break;
      auto rec = data_.next();
      if (!rec) {
        exhausted_ = true;
        break;
      }
      if (rec->inputs.size() != inputs_.size()) {
        throw Error(rec->source + ": provides " + std::to_string(rec->inputs.size()) + " input(s), the model has " +
                    std::to_string(inputs_.size()));
      }
      for (std::size_t i = 0; i < inputs_.size(); ++i)
        part.inputs.push_back(conform(rec->inputs[i], inputs_[i], rec->source, rec->batched));
      for (std::size_t i = 0; i < part.inputs.size(); ++i)
        if (!scalar_[i] && !other_axis_[i] && part.inputs[i].size(0) != part.inputs[lead_].size(0))
          throw Error(rec->source + ": inputs have different batch sizes");
      part.source = rec->source;
      if (lead_ != std::string::npos && !whole_records_ && part.inputs[lead_].size(0) == 0) {
        logs::warn("{}",
                   rec->source + ": holds no samples (shape " + c10::str(part.inputs[lead_].sizes()) + "); skipped");
        continue;
      }
    }
    if (!pending_.empty() && (whole_records_ || !same_sizes(pending_.front().inputs, part.inputs))) {
      held_ = std::move(part);
      break;
    }
    pending_.push_back(std::move(part));
    if (whole_records_) break;
  }
  std::int64_t rows = whole_records_ ? pending_rows() : std::min(pending_rows(), batch_size_);
  if (limit_ > 0) rows = std::min(rows, limit_ - delivered_);
  if (rows <= 0 || pending_.empty()) return std::nullopt;

  // The batch's samples [0, rows) are the first of the pending parts; the caller gets
  // [first, first + held) of them, joined from the parts that overlap it.
  // A batch of fewer samples than processes comes whole: every process then holds some
  // (batch statistics summed over the processes need every one of them to compute).
  const bool sliceable = !whole_records_ && lead_ != std::string::npos && rows >= share.parts;
  std::int64_t first = 0, held = rows;
  if (share.skip) {
    held = 0;
  } else if (sliceable && share.parts > 1) {
    first = rows * share.part / share.parts;
    held = rows * (share.part + 1) / share.parts - first;
  }
  Batch out;
  out.sliced = sliceable && share.parts > 1 && !share.skip;
  out.rows = rows;
  out.first = first;
  out.held = held;
  std::vector<std::vector<at::Tensor>> pieces(inputs_.size());
  std::int64_t at_row = 0;
  std::size_t used = 0;  // parts taken whole
  for (auto& p : pending_) {
    const std::int64_t n = rows_of(p), take = std::min(n, rows - at_row);
    if (take <= 0) break;
    if (out.source.empty()) out.source = p.source;
    else if (out.source.size() < p.source.size() ||
             out.source.compare(out.source.size() - p.source.size(), std::string::npos, p.source) != 0)
      out.source += ", " + p.source;
    const std::int64_t lo = std::max(first, at_row), hi = std::min(first + held, at_row + take);
    if (lo < hi) {
      std::vector<at::Tensor> piece;
      for (std::size_t i = 0; i < p.inputs.size(); ++i)
        piece.push_back(scalar_[i] || !sliceable ? p.inputs[i] : p.inputs[i].narrow(0, lo - at_row, hi - lo));
      check_finite(piece, p.source, p.offset + (lo - at_row));
      for (std::size_t i = 0; i < piece.size(); ++i) pieces[i].push_back(piece[i]);
    }
    at_row += take;
    if (take == n) {
      ++used;
    } else {  // the rest waits for the next batch
      for (std::size_t i = 0; i < p.inputs.size(); ++i)
        if (!scalar_[i]) p.inputs[i] = p.inputs[i].narrow(0, take, n - take);
      p.offset += take;
      break;
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(used));
  for (std::size_t i = 0; i < pieces.size() && held > 0; ++i) {
    if (scalar_[i] || pieces[i].size() == 1) out.inputs.push_back(pieces[i].front().contiguous());
    else out.inputs.push_back(at::cat(pieces[i], 0));
  }
  delivered_ += rows;
  return out;
}

SampleWindow::SampleWindow(std::unique_ptr<Dataset> data, const std::vector<ValueInfo>& inputs, std::int64_t first,
                           std::int64_t count)
    : data_(std::move(data)),
      samples_(*data_, inputs, 1, count > 0 ? first + count : 0),
      first_(first),
      count_(count) {}

std::string SampleWindow::describe() const {
  return data_->describe() + " (samples " + std::to_string(first_ + 1) + " to " +
         (count_ > 0 ? std::to_string(first_ + count_) : std::string("the last")) + ")";
}

std::optional<std::int64_t> SampleWindow::num_samples() const {
  auto n = data_->num_samples();
  if (!n) return std::nullopt;
  const std::int64_t left = std::max<std::int64_t>(0, *n - first_);
  return count_ > 0 ? std::min(left, count_) : left;
}

std::optional<Batch> SampleWindow::next() {
  while (auto b = samples_.next()) {
    if (read_++ < first_) continue;
    b->batched = true;  // one sample, batch dimension included
    return b;
  }
  return std::nullopt;
}

Prefetcher::Prefetcher(Batcher& batcher, std::function<BatchShare(std::int64_t)> share, std::size_t depth)
    : batcher_(batcher), share_(std::move(share)), depth_(std::max<std::size_t>(depth, 1)) {
  reader_ = std::thread([this] { read(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  reader_.join();
}

void Prefetcher::read() {
  try {
    for (std::int64_t index = 0;; ++index) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || ready_.size() < depth_; });
        if (stop_) return;
      }
      auto b = share_ ? batcher_.next(share_(index)) : batcher_.next();
      std::lock_guard<std::mutex> lock(mu_);
      if (!b) {
        done_ = true;
        cv_.notify_all();
        return;
      }
      ready_.push_back(std::move(*b));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    done_ = true;
    cv_.notify_all();
  }
}

std::optional<Batch> Prefetcher::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !ready_.empty() || done_; });
  if (!ready_.empty()) {
    Batch b = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return b;
  }
  if (error_) std::rethrow_exception(error_);
  return std::nullopt;
}

}  // namespace sparsebit
