// Note [Solved weights against rounding]: a weight-only run whose weights were solved is scored
// against round to nearest on the same grid by the model's loss on the calibration samples (a
// language model's next-token loss, checked here against torch's cross entropy; any other
// model's output error relative to float), and the rounded model takes its place where it does
// better.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "data_testing.h"
#include "sparsebit/core/session.h"
#include "test_support.h"

namespace sparsebit {
namespace {

constexpr std::int64_t kVocab = 24, kWidth = 32, kTime = 6, kSamples = 12;

/// ids [n, time] -> Gather(table [vocab, width]) -> Tanh -> MatMul(head [width, vocab]) -> logits:
/// a language model's shape, with a head that predicts token (t + 1) mod vocab after token t.
Graph language_model() {
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"ids", 7, false, {}, ""});
  g.outputs.push_back(ValueInfo{"logits", 1, false, {}, ""});
  at::manual_seed(5);
  const at::Tensor table = at::randn({kVocab, kWidth});
  g.initializers["table"] = table;
  g.initializers["head"] =
      at::linalg_pinv(at::tanh(table)).matmul(at::eye(kVocab).roll(1, 1) * 4) + at::randn({kWidth, kVocab}) * 0.05;
  g.append(testing::make_node("embed", "Gather", {"table", "ids"}, {"e"}));
  g.append(testing::make_node("act", "Tanh", {"e"}, {"h"}));
  g.append(testing::make_node("head_mm", "MatMul", {"h", "head"}, {"logits"}));
  return g;
}

/// x [n, width] -> MatMul -> Relu -> MatMul -> y: not a language model.
Graph two_layers() {
  Graph g;
  g.opset_imports[""] = 17;
  g.inputs.push_back(ValueInfo{"x", 1, false, {}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, false, {}, ""});
  at::manual_seed(9);
  g.initializers["w1"] = at::randn({kWidth, kWidth}) * 0.3;
  g.initializers["w2"] = at::randn({kWidth, 8}) * 0.3;
  g.append(testing::make_node("fc1", "MatMul", {"x", "w1"}, {"h"}));
  g.append(testing::make_node("relu", "Relu", {"h"}, {"r"}));
  g.append(testing::make_node("fc2", "MatMul", {"r", "w2"}, {"y"}));
  return g;
}

Config config(const std::string& w) {
  Config c = Config::from_string("[w]\nqscheme = \"per-group-symmetric\"\ngroup_size = 16\n" + w +
                                     "[calibration]\nmode = \"layerwise\"\nbatch_size = 4\n",
                                 "test.toml");
  c.plugins.use_environment = false;
  return c;
}

/// Mean cross entropy of each position's next token, by torch.
double next_token_loss(const at::Tensor& logits, const at::Tensor& ids) {
  const at::Tensor scores = logits.slice(1, 0, -1).reshape({-1, kVocab}).to(at::kDouble);
  return at::cross_entropy_loss(scores, ids.slice(1, 1).reshape({-1})).item<double>();
}

at::Tensor quantized_forward(QuantModel& qm, const at::Tensor& x) {
  qm.set_quant(true, true);
  return qm.forward({x})[0];
}

TEST(RoundingCheck, ScoresALanguageModelByItsNextTokenLoss) {
  // Text the head predicts: each token follows the one before it.
  const at::Tensor ids = (at::randint(0, kVocab, {kSamples, 1}, at::kLong) + at::arange(kTime)).remainder(kVocab);
  const DataSource calib = testing::one_batch_source(ids);
  const Session session(config("bits = 4\nquantizer = \"gptq\"\n"));
  QuantModel qm = session.quant_model(session.prepare(Model{language_model(), {}}, calib), calib);
  session.calibrate(qm, calib);
  const double solved = next_token_loss(quantized_forward(qm, ids), ids);
  const Session plain(config("bits = 4\nquantizer = \"rtn\"\n"));
  QuantModel reference = plain.quant_model(plain.prepare(Model{language_model(), {}}, calib), calib);
  plain.calibrate(reference, calib);
  const at::Tensor rounded_logits = quantized_forward(reference, ids);
  const double rounded = next_token_loss(rounded_logits, ids);

  const auto r = session.check_against_rounding(qm, Model{language_model(), {}}, calib);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->solver, "gptq");
  EXPECT_EQ(r->loss, "next-token loss");
  EXPECT_EQ(r->samples, kSamples);
  EXPECT_FALSE(r->held_out);
  EXPECT_NEAR(r->solved, solved, 1e-6 * solved);
  EXPECT_NEAR(r->rounded, rounded, 1e-6 * rounded);
  if (solved <= rounded) EXPECT_TRUE(r->kept_solved);
  if (!r->kept_solved) EXPECT_GT(solved - rounded, 2 * r->standard_error);
  EXPECT_GT(r->standard_error, 0);
  EXPECT_LT(solved, std::log(static_cast<double>(kVocab))) << "the head predicts the next token";
  if (!r->kept_solved) EXPECT_TRUE(at::equal(quantized_forward(qm, ids), rounded_logits));

  // With samples past [calibration] count, the scores come from those: the weights never saw them.
  Config counted = config("bits = 4\nquantizer = \"gptq\"\n");
  counted.calibration.count = 8;
  const Session held(counted);
  QuantModel solved_on_8 = held.quant_model(held.prepare(Model{language_model(), {}}, calib), calib);
  held.calibrate(solved_on_8, calib);
  const at::Tensor rest = ids.slice(0, 8);
  const double solved_rest = next_token_loss(quantized_forward(solved_on_8, rest), rest);
  const auto h = held.check_against_rounding(solved_on_8, Model{language_model(), {}}, calib);
  ASSERT_TRUE(h);
  EXPECT_TRUE(h->held_out);
  EXPECT_EQ(h->samples, kSamples - 8);
  EXPECT_NEAR(h->solved, solved_rest, 1e-6 * solved_rest);
  EXPECT_NEAR(h->rounded, next_token_loss(rounded_logits.slice(0, 8), rest), 1e-6 * h->rounded);

  EXPECT_FALSE(plain.check_against_rounding(reference, Model{language_model(), {}}, calib))
      << "plain rounding has nothing to check";
  Config off = config("bits = 4\nquantizer = \"gptq\"\n");
  off.calibration.rounding_check = false;
  EXPECT_FALSE(Session(off).check_against_rounding(qm, Model{language_model(), {}}, calib));
}

TEST(RoundingCheck, RoundingTakesThePlaceOfWeightsThatDoWorseAtTheOutput) {
  const at::Tensor x = at::randn({kSamples, kWidth});
  const DataSource calib = testing::one_batch_source(x);
  // The weights to check: 2-bit, where the session's grid is 4-bit with a clip search; round to
  // nearest at 4 bits is closer to float at the output by far, so it must take their place.
  const Session two_bits(config("bits = 2\nquantizer = \"rtn\"\n"));
  QuantModel qm = two_bits.quant_model(two_bits.prepare(Model{two_layers(), {}}, calib), calib);
  two_bits.calibrate(qm, calib);
  const at::Tensor coarse = quantized_forward(qm, x);

  const Session session(config("bits = 4\nquantizer = \"rtn\"\n[w.quantizer_options]\nclip_search = true\n"));
  const Session plain(config("bits = 4\nquantizer = \"rtn\"\n"));
  QuantModel reference = plain.quant_model(plain.prepare(Model{two_layers(), {}}, calib), calib);
  plain.calibrate(reference, calib);
  const at::Tensor rounded = quantized_forward(reference, x);
  reference.set_quant(false, false);
  const at::Tensor fp = reference.forward({x})[0];
  const double fp_energy = fp.pow(2).sum().item<double>();

  const auto r = session.check_against_rounding(qm, Model{two_layers(), {}}, calib);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->solver, "rtn clip search");
  EXPECT_EQ(r->loss, "output error");
  EXPECT_NEAR(r->solved, (coarse - fp).pow(2).sum().item<double>() / fp_energy, 1e-5);
  EXPECT_NEAR(r->rounded, (rounded - fp).pow(2).sum().item<double>() / fp_energy, 1e-5);
  EXPECT_FALSE(r->kept_solved);
  EXPECT_GT(r->solved - r->rounded, 2 * r->standard_error);
  EXPECT_TRUE(at::equal(quantized_forward(qm, x), rounded)) << "the rounded model took the solved one's place";
  EXPECT_EQ(qm.config().w.quantizer, "rtn");
}

}  // namespace
}  // namespace sparsebit
