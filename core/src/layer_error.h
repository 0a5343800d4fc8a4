#pragma once
// The error of one layer's outputs against float, relative per slice (not part of the public
// headers): shared by the range selection and the accuracy target's remedies.

#include <ATen/ATen.h>

#include <vector>

namespace sparsebit::detail {

/// Note [Relative layer error]
/// A candidate's error at a node is the squared error of each floating output relative to the
/// float output's energy, per slice along dim 1 (channels of an NCHW output, tokens of an
/// [N, T, C] one), summed over the slices. Absolute error lets large channels decide alone,
/// while normalization layers and the next weights rescale every channel: measured on PP-OCRv4's
/// recognizer, 90.5% exact-match with the absolute error against 99.0% with the relative one.
struct Reference {
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> energy;  ///< per output: [slices] float energy (undefined: not compared)
};

/// [N, S, rest] view of t, with S = dim 1 (1 for tensors of rank below 2).
inline at::Tensor slices(const at::Tensor& t) {
  if (t.dim() < 2) return t.reshape({1, 1, -1});
  return t.reshape({t.size(0), t.size(1), -1});
}

inline Reference reference_of(std::vector<at::Tensor> outputs) {
  Reference r;
  for (const auto& o : outputs) {
    if (!o.defined() || o.is_nested() || !o.is_floating_point() || o.numel() == 0) {
      r.energy.emplace_back();
      continue;
    }
    const at::Tensor v = slices(o.nan_to_num(0, 0, 0));
    r.energy.push_back(v.mul(v).sum(at::IntArrayRef{0, 2}, false, at::kDouble).cpu());
  }
  r.outputs = std::move(outputs);
  return r;
}

/// Per slice: the squared error of `got` against the reference output `want`.
inline at::Tensor slice_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor d = slices((got - want).nan_to_num(0, 0, 0));
  return d.mul(d).sum(at::IntArrayRef{0, 2}, false, at::kDouble).cpu();
}

/// One output's float energy and each candidate's squared error, per slice, summed over the
/// samples. Where the slice count changes between batches (another token count), totals over
/// all slices are kept from then on.
struct SliceSums {
  at::Tensor energy;
  std::vector<at::Tensor> error;  // per candidate

  void add(const at::Tensor& e, const std::vector<at::Tensor>& errs) {
    if (!energy.defined()) {
      energy = e.clone();
      for (const auto& x : errs) error.push_back(x.clone());
      return;
    }
    const bool same = energy.sizes() == e.sizes();
    if (!same) {
      energy = energy.sum().reshape({1});
      for (auto& x : error) x = x.sum().reshape({1});
    }
    energy += same ? e : e.sum().reshape({1});
    for (std::size_t c = 0; c < error.size(); ++c) error[c] += same ? errs[c] : errs[c].sum().reshape({1});
  }

  /// Candidate c's error relative to the energy of each slice, summed over the slices. Slices
  /// that are zero in float and stay so add nothing; a zero slice made non-zero counts fully.
  double relative(std::size_t c) const {
    if (!energy.defined()) return 0;
    const at::Tensor& num = error[c];
    return at::where(energy > 0, num / energy.clamp_min(1e-300), (num > 0).to(at::kDouble)).sum().item<double>();
  }
  /// relative(c) per slice: comparable between layers of different widths.
  double mean_relative(std::size_t c) const {
    return energy.defined() && energy.numel() > 0 ? relative(c) / static_cast<double>(energy.numel()) : 0;
  }
};

}  // namespace sparsebit::detail
