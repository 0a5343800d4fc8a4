// The min/max observer: the running minimum and maximum of everything observed, per tensor or
// per channel. Streams: memory is two values (or two per channel) whatever the data size.

#include <ATen/ATen.h>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

class MinMaxObserver final : public Observer, public MergeableObserver, public HandlesFloat8Elements {
 public:
  explicit MinMaxObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {}

  void observe(const at::Tensor& x_in) override {
    at::Tensor x = x_in.detach();
    if (x.numel() == 0) return;
    if (!x.is_floating_point()) x = x.to(at::kFloat);
    if (spec_.per_channel && spec_.group_size == 0) {
      const std::int64_t axis = spec_.channel_axis < 0 ? spec_.channel_axis + x.dim() : spec_.channel_axis;
      if (axis < 0 || axis >= x.dim())
        throw Error(where_ + ": channel axis " + std::to_string(spec_.channel_axis) +
                    " does not exist in a tensor of shape " + c10::str(x.sizes()));
    }
    auto [lo, hi] = range_per_param(x, spec_);  // parameter-shaped; device kernels when registered
    if (!min_.defined()) {
      min_ = lo;
      max_ = hi;
      return;
    }
    if (min_.sizes() != lo.sizes())
      throw Error(where_ + ": channel count changed between batches (" + std::to_string(min_.numel()) + " then " +
                  std::to_string(lo.numel()) + ")");
    min_ = at::minimum(min_, lo);
    max_ = at::maximum(max_, hi);
  }

  QParams compute() override {
    if (!min_.defined()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
    return qparams_from_range(min_, max_, spec_, where_);
  }

  void reset() override {
    min_ = at::Tensor();
    max_ = at::Tensor();
  }

  // Minimum and maximum merge exactly: several processes give the one process's parameters.
  std::vector<at::Tensor> state() const override {
    if (!min_.defined()) return {};
    return {min_, max_};
  }
  void merge(const std::vector<at::Tensor>& other) override {
    if (other.empty()) return;
    if (other.size() != 2) throw Error(where_ + ": not a minmax state");
    const at::Tensor lo = other[0].to(min_.defined() ? min_.device() : other[0].device());
    const at::Tensor hi = other[1].to(lo.device());
    if (!min_.defined()) {
      min_ = lo.clone();
      max_ = hi.clone();
      return;
    }
    if (min_.sizes() != lo.sizes()) throw Error(where_ + ": merging states of different channel counts");
    min_ = at::minimum(min_, lo);
    max_ = at::maximum(max_, hi);
  }

 private:
  QSpec spec_;
  std::string where_;
  at::Tensor min_, max_;
};

void register_all(Registrar& r) { r.add_observer<MinMaxObserver>("minmax"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.minmax", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
