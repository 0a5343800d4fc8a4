// The ACIQ observer (Banner et al., "Post-training 4-bit quantization of convolution networks
// for rapid-deployment", 2019): clip at alpha(bits) times a scale estimated for a Gaussian or a
// Laplace distribution.
//   laplace: b = mean |x - mean(x)|; clip = alpha_laplace(bits) * b
//   gaus:    sigma = (max - min) * 0.175 * (1 + sqrt(pi * ln 4)) / sqrt(2 ln N), N the elements
//            per sample (the expected range of N Gaussian draws); clip = alpha_gaus(bits) * sigma
// The range is [-clip, clip]; under an affine scheme with no negative values the "positive"
// tables apply and the range is [0, clip] (a half-normal / half-Laplace).
// Options: distribution = "gaus" | "laplace" (default "gaus").
//
// Weights use their exact values; activations keep running sums and a histogram (Note
// [Streaming histogram]) for mean |x - mean|, and never clip below Note [Clipping floor].

#include <ATen/ATen.h>

#include <cmath>
#include <map>

#include "histogram.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::observers {
namespace {

// Optimal clipping in units of sigma or b, per bit width (the paper's tables).
const std::map<int, double> kGaus = {{1, 1.24}, {2, 1.71}, {3, 2.15}, {4, 2.55},
                                     {5, 2.93}, {6, 3.28}, {7, 3.61}, {8, 3.92}};
const std::map<int, double> kGausPositive = {{1, 1.71}, {2, 2.15}, {3, 2.55}, {4, 2.93},
                                             {5, 3.28}, {6, 3.61}, {7, 3.92}, {8, 4.2}};
const std::map<int, double> kLaplace = {{1, 1.86}, {2, 2.83}, {3, 3.89}, {4, 5.03},
                                        {5, 6.2},  {6, 7.41}, {7, 8.64}, {8, 9.89}};
const std::map<int, double> kLaplacePositive = {{1, 2.83}, {2, 3.89}, {3, 5.02}, {4, 6.2},
                                                {5, 7.41}, {6, 8.64}, {7, 9.89}, {8, 11.16}};

class AciqObserver final : public Observer, public MergeableObserver {
 public:
  explicit AciqObserver(const ObserverContext& c) : spec_(c.spec), where_(c.where) {
    distribution_ = c.options.get_string("distribution", "gaus");
    if (distribution_ != "gaus" && distribution_ != "laplace")
      throw Error(c.options.where() + ": distribution must be \"gaus\" or \"laplace\", got \"" + distribution_ + "\"");
    if (spec_.bits < 1 || spec_.bits > 8) throw Error(where_ + ": the ACIQ tables cover 1 to 8 bits");
  }

  void observe(const at::Tensor& x) override {
    if (x.numel() == 0) return;
    shape_.assign(x.sizes().begin(), x.sizes().end());
    per_sample_ = x.dim() > 1 && !spec_.is_weight ? x.numel() / x.size(0) : x.numel();
    at::Tensor rows = channels_first(x.detach().to(at::kFloat), spec_);
    if (spec_.is_weight) {
      exact_ = rows.to(at::kCPU, at::kDouble).contiguous();
      if (spec_.per_channel) per_sample_ = exact_.size(1);
      return;
    }
    hist_.add(rows);
  }

  QParams compute() override {
    at::Tensor lo, hi, scale_estimate;
    if (exact_.defined()) {
      std::tie(lo, hi) = at::aminmax(exact_, 1);
      if (distribution_ == "laplace") scale_estimate = (exact_ - exact_.mean(1, true)).abs().mean(1);
    } else {
      if (hist_.empty()) throw Error(where_ + ": nothing was observed (is the calibration data empty?)");
      lo = hist_.min();
      hi = hist_.max();
      if (distribution_ == "laplace") {
        at::Tensor mean = hist_.sum() / double(hist_.count_per_channel());
        at::Tensor dev = (hist_.centers().unsqueeze(0) - mean.unsqueeze(1)).abs();
        scale_estimate = (dev * hist_.counts()).sum(1) / double(hist_.count_per_channel());
      }
    }
    if (distribution_ == "gaus") {
      const double n = std::max<double>(double(per_sample_), 2.0);
      scale_estimate = (hi - lo) * (0.175 * (1 + std::sqrt(M_PI * std::log(4.0)))) / std::sqrt(2 * std::log(n));
    }
    const bool half = !spec_.symmetric && lo.min().item<double>() >= 0;
    const auto& table =
        distribution_ == "laplace" ? (half ? kLaplacePositive : kLaplace) : (half ? kGausPositive : kGaus);
    at::Tensor clip = scale_estimate * table.at(spec_.bits);
    if (!exact_.defined()) {  // Note [Clipping floor]
      clip = clip.clone();
      for (std::int64_t c = 0; c < clip.size(0); ++c)
        clip[c] = std::max(clip[c].item<double>(), hist_.abs_keeping(c, 1 - kMaxClippedFraction));
    }
    at::Tensor low = half ? at::zeros_like(clip) : -clip;
    return range_qparams(low, clip, spec_, where_, shape_);
  }

  void reset() override {
    hist_.reset();
    exact_ = at::Tensor();
  }

  std::vector<at::Tensor> state() const override {
    return histogram_observer_state(hist_, shape_, {at::tensor({per_sample_}, at::TensorOptions().dtype(at::kLong))});
  }
  void merge(const std::vector<at::Tensor>& other) override {
    const auto extra = merge_histogram_observer_state(other, 1, hist_, shape_, where_ + ": not an aciq state");
    if (!extra.empty()) per_sample_ = extra[0].to(at::kCPU, at::kLong).item<std::int64_t>();
  }

 private:
  QSpec spec_;
  std::string where_;
  std::vector<std::int64_t> shape_;  // of the observed tensor, to shape the parameters
  std::string distribution_;
  std::int64_t per_sample_ = 0;
  StreamingHistogram hist_;
  at::Tensor exact_;
};

void register_all(Registrar& r) { r.add_observer<AciqObserver>("aciq"); }

}  // namespace
}  // namespace sparsebit::observers

SPARSEBIT_PLUGIN("sparsebit.observers.aciq", SPARSEBIT_PLUGIN_VERSION, sparsebit::observers::register_all)
