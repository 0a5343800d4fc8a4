// Signal processing for speech and audio front ends: DFT, STFT, the Hann / Hamming / Blackman
// windows and MelWeightMatrix. They compute in double and return the input's type (float for the
// tables unless output_datatype says otherwise) and quantize nothing: spectra span many decades, and no backend
// has an integer kernel for them. Complex values travel as a trailing dimension of 2, as ONNX
// writes them.

#include <ATen/ATen.h>

#include <cmath>

#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::int64_t scalar_int(const at::Tensor& t, const Node& n, const char* what) {
  auto v = int_list(t, n, what);
  if (v.size() != 1) throw Error(n.describe() + ": " + what + " must be a scalar");
  return v[0];
}

// A real ([..., 1]) or complex ([..., 2]) signal as a complex double tensor without the last dim
// (transforms run in double: the values that should cancel to 0 then do so to 1e-12, not 1e-5).
at::Tensor as_complex(const at::Tensor& x, const Node& n) {
  if (x.dim() < 2 || (x.size(-1) != 1 && x.size(-1) != 2))
    throw Error(n.describe() + ": input must end in a dimension of 1 (real) or 2 (complex), got " +
                c10::str(x.sizes()));
  at::Tensor f = x.to(at::kDouble);
  if (f.size(-1) == 1) return at::complex(f.squeeze(-1), at::zeros_like(f.squeeze(-1)));
  return at::view_as_complex(f.contiguous());
}

// DFT: along one signal axis (attribute `axis` up to opset 19, the third input from 20), with
// an optional length (zero-padded or truncated), inverse (scaled by 1/n) and onesided output.
class QDFT final : public NodeQModule {
 public:
  explicit QDFT(const OpContext& c)
      : NodeQModule(c),
        opset_(c.opset),
        axis_attr_(c.node.attr_int("axis", 1)),
        inverse_(c.node.attr_int("inverse", 0) != 0),
        onesided_(c.node.attr_int("onesided", 0) != 0) {
    if (inverse_ && onesided_) throw Error(describe() + ": onesided output of an inverse DFT is not defined");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t rank = x.dim();
    std::int64_t axis = axis_attr_;
    if (opset_ >= 20) {  // input form: negative axes count over the full rank, complex dim included
      axis = in.size() > 2 && in[2].defined() ? scalar_int(in[2], node(), "axis") : -2;
      if (axis < 0) axis += rank;
    } else if (axis < 0) {
      axis += rank - 1;
    }
    if (axis < 0 || axis > rank - 2)
      throw Error(describe() + ": axis must address a signal dimension of the rank-" + std::to_string(rank) +
                  " input (not the last, complex one)");
    if (onesided_ && x.size(-1) != 1) throw Error(describe() + ": onesided needs a real input ([..., 1])");
    at::Tensor z = as_complex(x, node());
    c10::optional<std::int64_t> length;
    if (in.size() > 1 && in[1].defined()) {
      length = scalar_int(in[1], node(), "dft_length");
      if (*length < 1) throw Error(describe() + ": dft_length must be positive");
    }
    at::Tensor y = inverse_ ? at::fft_ifft(z, length, axis) : at::fft_fft(z, length, axis);
    if (onesided_) y = y.narrow(axis, 0, y.size(axis) / 2 + 1);
    return {at::view_as_real(y).to(x.scalar_type())};
  }

 private:
  std::int64_t opset_, axis_attr_;
  bool inverse_, onesided_;
};

// STFT: frames of frame_length taken every frame_step samples, times the window, each
// transformed; output [batch, frames, bins, 2].
class QSTFT final : public NodeQModule {
 public:
  explicit QSTFT(const OpContext& c) : NodeQModule(c), onesided_(c.node.attr_int("onesided", 1) != 0) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& signal = in.at(0);
    if (signal.dim() != 3) throw Error(describe() + ": signal must be [batch, length, 1 or 2]");
    const std::int64_t step = scalar_int(in.at(1), node(), "frame_step");
    at::Tensor window = in.size() > 2 && in[2].defined() ? in[2] : at::Tensor();
    std::int64_t length = -1;
    if (in.size() > 3 && in[3].defined()) length = scalar_int(in[3], node(), "frame_length");
    if (window.defined()) {
      if (window.dim() != 1) throw Error(describe() + ": window must be 1-D");
      if (length >= 0 && length != window.size(0))
        throw Error(describe() + ": frame_length " + std::to_string(length) + " differs from the window's length " +
                    std::to_string(window.size(0)));
      length = window.size(0);
    }
    if (length < 1) throw Error(describe() + ": give a window or a frame_length");
    if (step < 1) throw Error(describe() + ": frame_step must be positive");
    if (signal.size(1) < length)
      throw Error(describe() + ": the signal (" + std::to_string(signal.size(1)) +
                  " samples) is shorter than a frame (" + std::to_string(length) + ")");
    if (onesided_ && signal.size(2) != 1) throw Error(describe() + ": onesided needs a real signal ([..., 1])");
    at::Tensor z = as_complex(signal, node()).unfold(1, length, step);  // [batch, frames, length]
    if (window.defined()) z = z * window.to(z.device(), at::kDouble);
    at::Tensor y = at::fft_fft(z, c10::nullopt, -1);
    if (onesided_) y = y.narrow(-1, 0, length / 2 + 1);
    return {at::view_as_real(y.contiguous()).to(signal.scalar_type())};
  }

 private:
  bool onesided_;
};

// Hann, Hamming and Blackman windows: a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), where N is
// the size (periodic) or size - 1 (symmetric).
class QWindow final : public NodeQModule {
 public:
  QWindow(const OpContext& c, double a0, double a1, double a2)
      : NodeQModule(c),
        a0_(a0),
        a1_(a1),
        a2_(a2),
        periodic_(c.node.attr_int("periodic", 1) != 0),
        dtype_(scalar_type_of(c.node.attr_int("output_datatype", 1), c.node)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const std::int64_t size = scalar_int(in.at(0), node(), "size");
    if (size < 1) throw Error(describe() + ": size must be positive");
    const double n = periodic_ ? static_cast<double>(size) : static_cast<double>(std::max<std::int64_t>(size - 1, 1));
    at::Tensor k = at::arange(size, at::kDouble) * (2 * kPi / n);
    at::Tensor w = a0_ - a1_ * at::cos(k) + a2_ * at::cos(2 * k);
    return {w.to(dtype_)};
  }

 private:
  double a0_, a1_, a2_;
  bool periodic_;
  at::ScalarType dtype_;
};

// MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins] triangular filters on the HTK mel scale
// (2595 log10(1 + f / 700)) between lower and upper edge, as ONNX defines them: num_mel_bins + 2
// points spaced by (high - low) / (num_mel_bins + 2) mels, each mapped to the spectrogram bin
// floor((dft_length + 1) f / sample_rate); filter i rises from point i to point i + 1 and falls
// to point i + 2.
class QMelWeightMatrix final : public NodeQModule {
 public:
  explicit QMelWeightMatrix(const OpContext& c)
      : NodeQModule(c), dtype_(scalar_type_of(c.node.attr_int("output_datatype", 1), c.node)) {}
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const std::int64_t mels = scalar_int(in.at(0), node(), "num_mel_bins");
    const std::int64_t dft = scalar_int(in.at(1), node(), "dft_length");
    const std::int64_t rate = scalar_int(in.at(2), node(), "sample_rate");
    const double low = in.at(3).reshape({-1})[0].item<double>(), high = in.at(4).reshape({-1})[0].item<double>();
    if (mels < 1 || dft < 1 || rate < 1)
      throw Error(describe() + ": num_mel_bins, dft_length and sample_rate must be positive");
    if (!(low >= 0 && high > low && high <= rate / 2.0))
      throw Error(describe() + ": need 0 <= lower_edge_hertz < upper_edge_hertz <= sample_rate / 2");
    auto mel = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
    const double mel_low = mel(low), step = (mel(high) - mel_low) / static_cast<double>(mels + 2);
    const std::int64_t bins = dft / 2 + 1;
    std::vector<std::int64_t> point(static_cast<std::size_t>(mels + 2));
    for (std::int64_t i = 0; i < mels + 2; ++i) {
      const double hz = 700.0 * (std::pow(10.0, (mel_low + static_cast<double>(i) * step) / 2595.0) - 1.0);
      point[static_cast<std::size_t>(i)] =
          static_cast<std::int64_t>(std::floor(static_cast<double>(dft + 1) * hz / rate));
    }
    at::Tensor w = at::zeros({bins, mels}, at::kDouble);
    auto a = w.accessor<double, 2>();
    auto set = [&](std::int64_t row, std::int64_t col, double v) {
      if (row < 0 || row >= bins)
        throw Error(describe() + ": filter " + std::to_string(col) + " reaches bin " + std::to_string(row) +
                    ", past the " + std::to_string(bins) + " spectrogram bins");
      a[row][col] = v;
    };
    for (std::int64_t i = 0; i < mels; ++i) {
      const std::int64_t left = point[i], center = point[i + 1], right = point[i + 2];
      if (center == left) set(center, i, 1.0);
      for (std::int64_t j = left; center > left && j <= center; ++j)
        set(j, i, static_cast<double>(j - left) / static_cast<double>(center - left));
      for (std::int64_t j = center; j < right; ++j)
        set(j, i, static_cast<double>(right - j) / static_cast<double>(right - center));
    }
    return {w.to(dtype_)};
  }

 private:
  at::ScalarType dtype_;
};

void register_all(Registrar& r) {
  r.add_op<QDFT>("DFT");
  r.add_op<QSTFT>("STFT");
  auto window = [&r](const char* op, double a0, double a1, double a2) {
    r.add_op_factory(op, "", [a0, a1, a2](const OpContext& c) -> std::unique_ptr<QModule> {
      return std::make_unique<QWindow>(c, a0, a1, a2);
    });
  };
  window("HannWindow", 0.5, 0.5, 0.0);
  window("HammingWindow", 25.0 / 46.0, 21.0 / 46.0, 0.0);
  window("BlackmanWindow", 0.42, 0.5, 0.08);
  r.add_op<QMelWeightMatrix>("MelWeightMatrix");
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.signal", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
