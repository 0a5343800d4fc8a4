// float_attention_scores: in scores = MatMul(q, kᵀ) -> Mul(scale) -> Add(bias) -> Softmax, the
// scores lose their quantizers while both MatMul inputs and the probabilities keep theirs; a
// Softmax that no MatMul feeds is left alone.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "pass_testing.h"

#include "sparsebit/core/data.h"
#include "sparsebit/core/quant_model.h"

namespace sparsebit::testing {
namespace {

/// Single-head self-attention over x [2, 6, 16] with a constant additive bias on the scores.
Builder attention() {
  at::manual_seed(4);
  Builder b({2, 6, 16}, 13);
  for (const char* w : {"wq", "wk", "wv"}) b.constant(w, at::randn({16, 16}) * 0.3);
  b.constant("scale", at::full({}, 0.25));
  b.constant("bias", at::randn({6, 6}));
  b.add("q", "MatMul", {"x", "wq"}, {"q"});
  b.add("k", "MatMul", {"x", "wk"}, {"k"});
  b.add("v", "MatMul", {"x", "wv"}, {"v"});
  b.add("kt", "Transpose", {"k"}, {"kt"}, {{"perm", Attribute::of_ints({0, 2, 1})}});
  b.add("qk", "MatMul", {"q", "kt"}, {"scores"});
  b.add("scaled", "Mul", {"scores", "scale"}, {"scaled"});
  b.add("biased", "Add", {"bias", "scaled"}, {"biased"});  // the scores as the second operand
  b.add("softmax", "Softmax", {"biased"}, {"probs"}, {{"axis", Attribute::of_int(-1)}});
  b.add("pv", "MatMul", {"probs", "v"}, {"y"});
  return b;
}

/// x -> Relu -> Softmax -> MatMul: no attention scores here.
Builder plain_softmax() {
  Builder b({2, 6, 16}, 13);
  b.constant("w", at::randn({16, 4}));
  b.add("relu", "Relu", {"x"}, {"r"});
  b.add("softmax", "Softmax", {"r"}, {"p"}, {{"axis", Attribute::of_int(-1)}});
  b.add("proj", "MatMul", {"p", "w"}, {"y"});
  return b;
}

/// (node, input) of every activation quantizer in use after calibration.
std::set<std::pair<std::string, std::size_t>> quantized(const Builder& b, bool rule) {
  TempDir dir;
  write_npy(at::randn({2, 6, 16}), dir / "x.npy");
  Config c = Config::from_file(source_path("configs/w8a8_onnxruntime.toml"));
  c.passes.switches["float_attention_scores"] = rule;
  QuantModel qm(Model{b.g.clone(), ModelMeta{}}, c, shipped_registry());
  auto data = open_dataset(dir.path().string(), qm.graph().inputs);
  qm.calibrate(*data);
  std::set<std::pair<std::string, std::size_t>> out;
  for (const auto& s : qm.slots())
    if (s.role == InputRole::kActivation && s.active()) out.insert({s.node_name, s.input_index});
  return out;
}

TEST(FloatAttentionScores, TheScoresLoseTheirQuantizersTheMatMulInputsAndProbabilitiesKeepThem) {
  const auto on = quantized(attention(), true), off = quantized(attention(), false);
  for (const std::pair<std::string, std::size_t> scores :
       {std::pair<std::string, std::size_t>{"scaled", 0}, {"biased", 1}, {"softmax", 0}})
    EXPECT_FALSE(on.count(scores)) << scores.first << " input " << scores.second;
  // Without the rule the Softmax rounds the scores to 8 bits.
  EXPECT_TRUE(off.count({"softmax", 0}));
  for (const std::pair<std::string, std::size_t> kept :
       {std::pair<std::string, std::size_t>{"qk", 0}, {"qk", 1}, {"pv", 0}, {"pv", 1}})
    EXPECT_TRUE(on.count(kept)) << kept.first << " input " << kept.second;
}

TEST(FloatAttentionScores, ASoftmaxNoMatMulFeedsKeepsItsQuantizer) {
  const auto on = quantized(plain_softmax(), true);
  EXPECT_TRUE(on.count({"softmax", 0}));
  EXPECT_TRUE(on.count({"proj", 0}));
}

}  // namespace
}  // namespace sparsebit::testing
