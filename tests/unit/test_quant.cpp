// Quantization arithmetic against independent references: torch's fake_quantize_* ops and
// hand-computed values.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {
namespace {

QParams per_tensor(double scale, int zp) {
  return {at::scalar_tensor(scale, at::kFloat), at::scalar_tensor(zp, at::TensorOptions().dtype(at::kInt))};
}

TEST(Quant, RangesFollowBitsSchemeAndNarrowRange) {
  QSpec s;
  EXPECT_EQ(s.qmin(), -128);
  EXPECT_EQ(s.qmax(), 127);
  s.narrow_range = true;
  EXPECT_EQ(s.qmin(), -127);
  s.symmetric = false;
  s.narrow_range = false;
  EXPECT_EQ(s.qmin(), 0);
  EXPECT_EQ(s.qmax(), 255);
  s.bits = 4;
  EXPECT_EQ(s.qmax(), 15);
  s.symmetric = true;
  EXPECT_EQ(s.qmin(), -8);
  EXPECT_EQ(s.qmax(), 7);
}

TEST(Quant, RoundsHalfToEvenByHand) {
  // scale 0.5 makes x / scale exact, so ties are real ties.
  QSpec s;
  at::Tensor x = at::tensor({0.25f, 0.75f, 1.25f, -0.25f, -0.75f, 100.0f, -100.0f}, at::kFloat);
  at::Tensor q = quantize_to_int(x, per_tensor(0.5, 0), s);
  std::vector<int> expected = {0, 2, 2, 0, -2, 127, -128};  // 0.5->0, 1.5->2, 2.5->2, clamps
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(q[static_cast<long>(i)].item<int>(), expected[i]) << i;
  at::Tensor fq = fake_quantize(x, per_tensor(0.5, 0), s);
  EXPECT_FLOAT_EQ(fq[1].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(fq[5].item<float>(), 63.5f);
  EXPECT_FLOAT_EQ(fq[6].item<float>(), -64.0f);
}

// torch multiplies by a float reciprocal of the scale where ONNX Runtime (and we) divide; the
// two quotients can land on different sides of a rounding boundary. Everywhere else the results
// must be identical, and those places must be exactly the ones where the quotients round apart.
TEST(Quant, PerTensorMatchesTorchFakeQuantizeExactly) {
  at::manual_seed(0);
  at::Tensor x = at::randn({1 << 20}) * 3.0;
  for (auto [symmetric, scale, zp] : {std::tuple{true, 0.0173, 0}, {false, 0.031, 97}, {false, 0.002, 255}}) {
    QSpec s;
    s.symmetric = symmetric;
    at::Tensor ours = fake_quantize(x, per_tensor(scale, zp), s);
    at::Tensor ref = at::fake_quantize_per_tensor_affine(x, scale, zp, s.qmin(), s.qmax());
    const float fscale = static_cast<float>(scale);
    at::Tensor rounds_apart = at::round(x / fscale) != at::round(x * (1.0f / fscale));
    at::Tensor differ = ours != ref;
    EXPECT_TRUE(at::equal(differ, at::logical_and(differ, rounds_apart))) << "scale " << scale << ": a difference "
                                                                          << "not explained by division vs reciprocal";
    EXPECT_LT(differ.sum().item<std::int64_t>(), x.numel() / 10000) << "scale " << scale;
    at::Tensor same = at::logical_not(rounds_apart);
    EXPECT_TRUE(at::equal(ours.masked_select(same), ref.masked_select(same))) << "scale " << scale;
  }
  // With a power-of-two scale both are exact, so torch and we agree everywhere, ties included.
  QSpec s;
  at::Tensor ties = (at::arange(-300, 300).to(at::kFloat) + 0.5) * 0.125;
  EXPECT_TRUE(at::equal(fake_quantize(ties, per_tensor(0.125, 0), s),
                        at::fake_quantize_per_tensor_affine(ties, 0.125, 0, -128, 127)));
}

TEST(Quant, PerChannelMatchesTorchFakeQuantizeExactly) {
  at::manual_seed(1);
  at::Tensor x = at::randn({16, 8, 3, 3});
  for (std::int64_t axis : {0, 1}) {
    const auto c = x.size(axis);
    QSpec s;
    s.per_channel = true;
    s.channel_axis = axis;
    QParams p{at::rand({c}) * 0.05 + 0.001, at::zeros({c}, at::TensorOptions().dtype(at::kInt))};
    at::Tensor ours = fake_quantize(x, p, s);
    at::Tensor ref = at::fake_quantize_per_channel_affine(x, p.scale, p.zero_point, axis, s.qmin(), s.qmax());
    EXPECT_TRUE(at::equal(ours, ref)) << "axis " << axis;
  }
}

// Every bit width 2-8, symmetric (plain and narrow) and affine, per tensor and per channel:
// identical to torch wherever division and torch's reciprocal multiplication round alike.
TEST(Quant, EveryBitWidthAndSchemeMatchesTorch) {
  at::manual_seed(4);
  at::Tensor x = at::randn({32, 6, 64}) * 2;
  for (int bits = 2; bits <= 8; ++bits) {
    for (int scheme = 0; scheme < 3; ++scheme) {
      for (bool per_channel : {false, true}) {
        QSpec s;
        s.bits = bits;
        s.symmetric = scheme != 2;
        s.narrow_range = scheme == 1;
        s.per_channel = per_channel;
        s.channel_axis = 1;
        at::Tensor lo = per_channel ? -at::rand({6}) * 3 - 0.1 : at::scalar_tensor(-2.5);
        at::Tensor hi = per_channel ? at::rand({6}) * 3 + 0.1 : at::scalar_tensor(3.5);
        QParams p = qparams_from_range(lo, hi, s, "t");
        at::Tensor ours = fake_quantize(x, p, s);
        at::Tensor ref = per_channel
                             ? at::fake_quantize_per_channel_affine(x, p.scale, p.zero_point, 1, s.qmin(), s.qmax())
                             : at::fake_quantize_per_tensor_affine(
                                   x, p.scale.item<double>(), p.zero_point.item<std::int64_t>(), s.qmin(), s.qmax());
        at::Tensor sc = per_channel ? p.scale.reshape({1, 6, 1}) : p.scale;
        at::Tensor apart = at::round(x / sc) != at::round(x * (1.0f / sc));
        at::Tensor same = at::logical_not(apart);
        EXPECT_TRUE(at::equal(ours.masked_select(same), ref.masked_select(same)))
            << bits << " bits, scheme " << scheme << (per_channel ? ", per channel" : ", per tensor");
        // Every value lies on the b-bit grid.
        at::Tensor q = quantize_to_int(x, p, s);
        EXPECT_GE(q.min().item<int>(), s.qmin());
        EXPECT_LE(q.max().item<int>(), s.qmax());
      }
    }
  }
}

TEST(Quant, PerGroupQuantizesEachBlockWithItsOwnScale) {
  // A [2, 5] weight in blocks of 2 along axis 1: blocks {0,1}, {2,3}, {4} per row.
  QSpec s;
  s.bits = 4;
  s.per_channel = true;
  s.group_size = 2;
  s.group_axis = 1;
  at::Tensor w = at::tensor({0.1f, -0.7f, 2.0f, 0.3f, 5.0f, -1.0f, 0.2f, 0.05f, -0.4f, 1.5f}).reshape({2, 5});
  EXPECT_EQ(group_param_shape(w, s), (std::vector<std::int64_t>{2, 3}));
  at::Tensor rows = quant_rows(w, s);
  ASSERT_EQ(rows.sizes(), (std::vector<std::int64_t>{6, 2}));
  at::Tensor lo, hi;
  std::tie(lo, hi) = at::aminmax(rows, 1);
  QParams p = qparams_from_range(rows_to_params(lo, {2, 5}, s), rows_to_params(hi, {2, 5}, s), s, "w");
  ASSERT_EQ(p.scale.sizes(), (std::vector<std::int64_t>{2, 3}));
  // By hand: block (row 0, cols 2-3) = {2.0, 0.3} -> scale 2 * 2.0 / 15.
  EXPECT_FLOAT_EQ(p.scale[0][1].item<float>(), 4.0f / 15);
  at::Tensor fq = fake_quantize(w, p, s);
  for (std::int64_t r = 0; r < 2; ++r) {
    for (std::int64_t b = 0; b < 3; ++b) {
      QSpec t = s;
      t.per_channel = false;
      t.group_size = 0;
      QParams one{p.scale[r][b], p.zero_point[r][b]};
      const std::int64_t len = std::min<std::int64_t>(2, 5 - 2 * b);
      at::Tensor block = w[r].narrow(0, 2 * b, len);
      EXPECT_TRUE(at::equal(fq[r].narrow(0, 2 * b, len), fake_quantize(block, one, t))) << r << "," << b;
    }
  }
}

TEST(Quant, StraightThroughGradientMatchesTorch) {
  at::manual_seed(2);
  at::Tensor base = at::randn({4096}) * 4;
  at::Tensor x1 = base.clone().set_requires_grad(true);
  at::Tensor x2 = base.clone().set_requires_grad(true);
  QSpec s;
  fake_quantize(x1, per_tensor(0.02, 0), s).sum().backward();
  at::fake_quantize_per_tensor_affine(x2, 0.02, 0, -128, 127).sum().backward();
  EXPECT_TRUE(at::equal(x1.grad(), x2.grad()));
  EXPECT_GT(x1.grad().sum().item<float>(), 100);  // some inside, some clipped
  EXPECT_LT(x1.grad().sum().item<float>(), 4096);
}

TEST(Quant, QParamsFromRangeByHand) {
  QSpec sym;
  QParams p = qparams_from_range(at::scalar_tensor(-2.0), at::scalar_tensor(1.0), sym, "t");
  EXPECT_FLOAT_EQ(p.scale.item<float>(), 2 * 2.0f / 255);  // 2 * max|x| / (qmax - qmin)
  EXPECT_EQ(p.zero_point.item<int>(), 0);

  QSpec aff;
  aff.symmetric = false;
  p = qparams_from_range(at::scalar_tensor(-1.0), at::scalar_tensor(3.0), aff, "t");
  EXPECT_FLOAT_EQ(p.scale.item<float>(), 4.0f / 255);
  EXPECT_EQ(p.zero_point.item<int>(), 64);  // round(1 / (4/255)) = round(63.75)

  // The range always includes 0: a positive-only range keeps zero point 0.
  p = qparams_from_range(at::scalar_tensor(0.5), at::scalar_tensor(2.0), aff, "t");
  EXPECT_FLOAT_EQ(p.scale.item<float>(), 2.0f / 255);
  EXPECT_EQ(p.zero_point.item<int>(), 0);

  // A constant zero tensor gets the floor scale, not NaN.
  p = qparams_from_range(at::scalar_tensor(0.0), at::scalar_tensor(0.0), sym, "t");
  EXPECT_FLOAT_EQ(p.scale.item<float>(), static_cast<float>(kMinScale));
}

TEST(Quant, NonFiniteRangeIsAnErrorNamingTheTensor) {
  QSpec s;
  try {
    qparams_from_range(at::scalar_tensor(-1.0), at::scalar_tensor(INFINITY), s, "input 0 of node 'conv7'");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NaN/Inf"), std::string::npos) << e.what();
  }
}

// The CPU's one-pass fake quantization gives the division formula's floats bit for bit: ties
// (round half to even), values beyond the grid, NaN and infinities, per tensor, per channel and
// per group (runs long and short enough for its vector loop and its scalar tail), channels last.
TEST(Quant, CpuFakeQuantizeIsTheDivisionFormulaBitForBit) {
  auto formula = [](const at::Tensor& x, const at::Tensor& s, const at::Tensor& zp, const QSpec& spec) {
    const at::Tensor q = at::round(x / s) + zp;
    return (at::clamp(q, double(spec.qmin()), double(spec.qmax())) - zp) * s;
  };
  auto same_bits = [](const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor nan = at::isnan(a);
    if (!at::equal(nan, at::isnan(b))) return false;
    return at::equal(a.masked_fill(nan, 0).contiguous().view(at::kInt),
                     b.masked_fill(nan, 0).contiguous().view(at::kInt));
  };
  at::manual_seed(21);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float scale = 0.0173f;
  at::Tensor special = at::tensor({inf, -inf, nan, 1e30f, -1e30f, 0.0f, -0.0f});
  at::Tensor ties = (at::arange(-200, 200).to(at::kFloat) + 0.5f) * scale;
  at::Tensor x = at::cat({at::randn({100003}) * 3, ties, special});
  for (auto [symmetric, zp] : {std::pair{true, 0}, std::pair{false, 97}}) {
    QSpec spec;
    spec.symmetric = symmetric;
    const at::Tensor got = fake_quantize(x, per_tensor(scale, zp), spec);
    EXPECT_TRUE(same_bits(got, formula(x, at::scalar_tensor(scale), at::scalar_tensor(float(zp)), spec))) << zp;
  }
  for (std::int64_t inner : {40, 7}) {
    at::Tensor y = at::randn({3, 5, inner}) * 2;
    y[1][2][3] = nan;
    y[2][4][0] = inf;
    QSpec spec;
    spec.per_channel = true;
    spec.channel_axis = 1;
    QParams p{at::rand({5}) * 0.05 + 0.001, at::zeros({5}, at::TensorOptions().dtype(at::kInt))};
    EXPECT_TRUE(same_bits(fake_quantize(y, p, spec), formula(y, p.scale.reshape({1, 5, 1}), at::zeros({1}), spec)))
        << inner;
  }
  // Per group along the last axis (runs of a group, the last one short) and along the first
  // (rows with a parameter per value: [K, N] weights grouped along K), with zero points.
  for (auto [rows, cols, axis] : {std::tuple{6, 100, 1}, std::tuple{100, 40, 0}, std::tuple{70, 21, 0}}) {
    at::Tensor w = at::randn({rows, cols}) * 2;
    w[3][5] = nan;
    w[4][7] = -inf;
    QSpec spec;
    spec.bits = 4;
    spec.symmetric = false;
    spec.per_channel = true;
    spec.channel_axis = 1 - axis;
    spec.group_size = 32;
    spec.group_axis = axis;
    const auto shape = group_param_shape(w, spec);
    QParams p{at::rand(shape) * 0.3 + 0.01, at::randint(0, 16, shape, at::TensorOptions().dtype(at::kInt))};
    const at::Tensor got = fake_quantize(w, p, spec);
    const std::int64_t along = axis;  // a lambda may not capture a structured binding (C++17)
    auto expand = [&](const at::Tensor& t) { return t.repeat_interleave(32, along).narrow(along, 0, w.size(along)); };
    EXPECT_TRUE(same_bits(got, formula(w, expand(p.scale), expand(p.zero_point.to(at::kFloat)), spec)))
        << rows << " x " << cols << " along " << axis;
  }
  const at::Tensor cl = (at::randn({2, 24, 5, 3}) * 2).contiguous(at::MemoryFormat::ChannelsLast);
  QSpec affine;
  affine.symmetric = false;
  EXPECT_TRUE(same_bits(fake_quantize(cl, per_tensor(scale, 120), affine),
                        formula(cl, at::scalar_tensor(scale), at::scalar_tensor(120.0f), affine)));
}

// histogram_counts' CPU loop against the bin formula written out with ATen ops: one row long
// enough to be split in chunks (uneven last chunk), several rows, values beyond the range and
// exactly on bin edges.
TEST(Quant, HistogramCountsMatchTheBinFormula) {
  auto formula = [](const at::Tensor& rows, double range, std::int64_t bins) {
    const double width = 2 * range / double(bins);
    at::Tensor idx = at::floor((rows.to(at::kDouble) + range) / width).clamp(0, bins - 1).to(at::kLong);
    idx = idx + at::arange(rows.size(0), idx.options()).unsqueeze(1) * bins;
    return at::bincount(idx.reshape({-1}), {}, rows.size(0) * bins).reshape({rows.size(0), bins});
  };
  at::manual_seed(11);
  const at::Tensor long_row = at::randn({1, (1 << 20) + 12345}) * 1.5;
  at::Tensor edges = at::linspace(-2.5, 2.5, 81).reshape({1, -1});  // bin edges of [-2, 2] / 64, and beyond
  const at::Tensor rows = at::randn({5, 3001});
  for (const auto& [x, range, bins] :
       {std::tuple{long_row, 3.0, std::int64_t{4096}}, std::tuple{edges, 2.0, std::int64_t{64}},
        std::tuple{rows, 1.0, std::int64_t{128}}}) {
    const at::Tensor got = histogram_counts(x, range, bins);
    EXPECT_TRUE(at::equal(got, formula(x, range, bins)));
    EXPECT_EQ(got.sum().item<std::int64_t>(), x.numel());
  }
  EXPECT_EQ(histogram_counts(edges, 2.0, 64)[0][63].item<std::int64_t>(),
            (edges >= 2.0 - 4.0 / 64).sum().item<std::int64_t>());
}

// The whole-tensor range is the exact minimum and maximum, NaN included.
TEST(Quant, PerTensorRangeIsTheExactMinimumAndMaximum) {
  QSpec spec;
  spec.bits = 8;
  at::manual_seed(12);
  const at::Tensor x = at::randn({8, 16, 30, 30});
  auto [lo, hi] = range_per_param(x, spec);
  EXPECT_EQ(lo.dim(), 0);
  EXPECT_EQ(lo.item<float>(), x.min().item<float>());
  EXPECT_EQ(hi.item<float>(), x.max().item<float>());
  at::Tensor y = x.clone();
  y[3][2][1][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(range_per_param(y, spec).second.item<float>()));
}

TEST(Quant, ChannelsLastTensorsQuantizeInPlaceOfTheirLayout) {
  // Note [Dense layouts]: per-tensor work on a channels-last tensor gives the values torch's
  // fake quantization gives on the same values, keeps the layout, and its rows and ranges are
  // those of the tensor's values.
  at::manual_seed(3);
  const at::Tensor x = (at::randn({2, 5, 7, 3}) * 2.0).contiguous(at::MemoryFormat::ChannelsLast);
  ASSERT_FALSE(x.is_contiguous());
  QSpec s;
  s.symmetric = false;
  const at::Tensor y = fake_quantize(x, per_tensor(0.0625, 120), s);
  EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(y, at::fake_quantize_per_tensor_affine(x.contiguous(), 0.0625, 120, 0, 255)));
  auto [lo, hi] = range_per_param(x, s);
  EXPECT_EQ(lo.item<float>(), x.min().item<float>());
  EXPECT_EQ(hi.item<float>(), x.max().item<float>());
  const at::Tensor rows = quant_rows(x, s);
  ASSERT_EQ(rows.sizes(), (std::vector<std::int64_t>{1, x.numel()}));
  EXPECT_EQ(rows.data_ptr(), x.data_ptr()) << "a copy of the whole tensor";
  EXPECT_TRUE(at::equal(std::get<0>(rows.sort(1)), std::get<0>(x.reshape({1, -1}).sort(1))));
  // Gradients flow back in the input's layout (straight-through inside the grid).
  at::Tensor xg = x.detach().clone(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  fake_quantize(xg, per_tensor(0.0625, 120), s).sum().backward();
  const at::Tensor inside = at::logical_and(at::round(x / 0.0625) + 120 >= 0, at::round(x / 0.0625) + 120 <= 255);
  EXPECT_TRUE(at::equal(xg.grad(), inside.to(at::kFloat)));
}

}  // namespace
}  // namespace sparsebit
