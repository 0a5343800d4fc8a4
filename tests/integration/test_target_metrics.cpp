// The accuracy target's metrics, each checked against a figure computed outside the search or by
// hand: maxabs, argmax-agreement and ctc-agreement (the search itself: test_target.cpp).

#include "target_support.h"

namespace sparsebit::target_tests {
namespace {

// maxabs is the largest |quantized - float| of any output element over the held-out samples,
// recomputed here outside the search; a tolerance that only both sabotaged layers in float
// meet is met with them, and the search's figures are those measured independently.
double largest_difference_with(QuantModel& qm, const TargetData& d, const std::set<std::string>& floats) {
  for (const auto& n : floats) qm.set_enabled(n, false);
  double largest = 0;
  for (const auto& x : d.holdout) {
    qm.set_quant(false, false);
    at::Tensor f = qm.forward(x)[0].to(at::kDouble);
    qm.set_quant(true, true);
    at::Tensor q = qm.forward(x)[0].to(at::kDouble);
    largest = std::max(largest, (q - f).abs().max().item<double>());
  }
  qm.set_quant(false, false);
  for (const auto& n : floats) qm.set_enabled(n, true);
  return largest;
}

TEST(Target, MaxAbsIsTheLargestOutputDifference) {
  Fixture f = calibrated(kSabotaged);
  const double none = largest_difference_with(f.qm, f.data, {});
  const double both = largest_difference_with(f.qm, f.data, {"/dw3/Conv", "/fc1/Gemm"});
  const double dw3 = largest_difference_with(f.qm, f.data, {"/dw3/Conv"});
  const double fc1 = largest_difference_with(f.qm, f.data, {"/fc1/Gemm"});
  ASSERT_LT(both, std::min(dw3, fc1) * 0.9) << "the fixture needs both sabotaged layers to matter";
  const double goal = (both + std::min(dw3, fc1)) / 2;
  char expr[64];
  std::snprintf(expr, sizeof expr, "maxabs<=%.9f", goal);
  TargetReport r = meet_target(f.qm, target(expr, {"float"}, 4), f.data);
  EXPECT_NEAR(r.before, none, 1e-9 * none);
  EXPECT_TRUE(r.reached);
  EXPECT_LE(r.after, goal);
  std::set<std::string> chosen;
  for (const auto& l : r.fallback_layers) chosen.insert(l.node);
  EXPECT_EQ(chosen, (std::set<std::string>{"/dw3/Conv", "/fc1/Gemm"}));
  EXPECT_NEAR(r.after, both, 1e-9 * both);

  // Measured on the outputs named (here the only one, by name): the same figure; a name the model
  // does not have is refused with the names it has.
  Fixture named = calibrated(kSabotaged);
  TargetConfig on_output = target("maxabs<=1e9", {"float"}, 4);
  on_output.outputs = {named.qm.graph().outputs.at(0).name};
  TargetReport by_name = meet_target(named.qm, on_output, named.data);
  EXPECT_NEAR(by_name.before, none, 1e-9 * none);
  EXPECT_NE(by_name.measured_on.find(on_output.outputs[0]), std::string::npos) << by_name.measured_on;
  on_output.outputs = {"no_such_output"};
  const std::string msg = testing::error_of([&] { meet_target(named.qm, on_output, named.data); });
  EXPECT_NE(msg.find("no output 'no_such_output'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(named.qm.graph().outputs.at(0).name), std::string::npos) << msg;
}

// argmax-agreement: the share of positions (all indices but the last) whose largest entry is
// float's. By hand: of three positions of a [1, 3, 2] output, the first picks the other class,
// the second agrees, the third holds a NaN and so never agrees; a [2, 1] output beside it has no
// class axis and is left out; measured on that output alone the metric has nothing to count.
// An integer output is not measured at all.
TEST(Target, ArgmaxAgreementCountsPositionsWhoseClassIsFloats) {
  const at::Tensor f = at::tensor({1.0F, 0.0F, 0.0F, 1.0F, 2.0F, 1.0F}).view({1, 3, 2});
  const at::Tensor q = at::tensor({0.4F, 0.5F, 0.0F, 1.0F, NAN, 0.0F}).view({1, 3, 2});
  const at::Tensor p = at::tensor({0.3F, 0.9F}).view({2, 1});
  target_detail::Agreement a;  // as the search measures: outputs through float_outputs
  const at::Tensor ids = at::tensor({3, 1});
  a.add(target_detail::float_outputs({f, p, ids}), target_detail::float_outputs({q, p + 0.5, ids + 1}));
  EXPECT_DOUBLE_EQ(a.metric("argmax-agreement"), 1.0 / 3.0);
  target_detail::Agreement none;
  none.add({p}, {p});
  const std::string msg = testing::error_of([&] { none.metric("argmax-agreement"); });
  EXPECT_NE(msg.find("no measured output has a class axis"), std::string::npos) << msg;
}

// ctc-agreement decodes each sequence greedily (largest class per step, repeats merged, the
// blank dropped) and counts the sequences decoded as float decodes them. By hand, classes
// {blank 0, a 1, b 2}, five steps: float "a a _ b b" reads "ab"; q1 "a _ a b _" reads "aab"
// (differs; 2 of 5 steps agree); q2 "_ a a _ b" reads "ab" (agrees; 2 of 5 steps agree too);
// q3 holds a NaN (4 of 5 steps agree, the text does not count). [T, 1, C] is read as [1, T, C]; the blank counted from
// the end reads another text; a blank outside the classes is refused.
at::Tensor one_hot_steps(const std::vector<std::int64_t>& classes) {
  at::Tensor t = at::zeros({1, static_cast<std::int64_t>(classes.size()), 3});
  for (std::size_t i = 0; i < classes.size(); ++i) t[0][static_cast<std::int64_t>(i)][classes[i]] = 1.0;
  return t;
}

TEST(Target, CtcAgreementComparesGreedyDecodings) {
  const at::Tensor f = one_hot_steps({1, 1, 0, 2, 2});
  const at::Tensor q1 = one_hot_steps({1, 0, 1, 2, 0}), q2 = one_hot_steps({0, 1, 1, 0, 2});
  at::Tensor q3 = f.clone();
  q3[0][4][0] = NAN;
  target_detail::Agreement a;
  a.ctc_blank = 0;
  for (const auto& q : {q1, q2, q3}) a.add(target_detail::float_outputs({f}), target_detail::float_outputs({q}));
  EXPECT_DOUBLE_EQ(a.metric("ctc-agreement"), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(a.metric("argmax-agreement"), (2.0 + 2.0 + 4.0) / 15.0);
  target_detail::Agreement time_first;
  time_first.ctc_blank = 0;
  time_first.add({f.transpose(0, 1)}, {q2.transpose(0, 1)});
  EXPECT_DOUBLE_EQ(time_first.metric("ctc-agreement"), 1.0);
  // Blank = the last class (2), class 0 a character: float reads [1, 0], q1 [1, 0, 1, 0] (differs),
  // "1 0 0 2 2" [1, 0] (agrees).
  target_detail::Agreement last;
  last.ctc_blank = -1;
  last.add({f}, {q1});
  last.add({f}, {one_hot_steps({1, 0, 0, 2, 2})});
  EXPECT_DOUBLE_EQ(last.metric("ctc-agreement"), 0.5);
  target_detail::Agreement bad;
  bad.ctc_blank = 3;
  const std::string msg = testing::error_of([&] { bad.add({f}, {q1}); });
  EXPECT_NE(msg.find("ctc_blank 3 is not a class of an output of 3 classes"), std::string::npos) << msg;
}

// On the classifier with two layers sabotaged, the held-out share of samples whose class is
// float's, measured outside the search, is the search's starting figure; a goal that only both
// layers in float reach is met with them.
double agreement_with(QuantModel& qm, const TargetData& d, const std::set<std::string>& floats) {
  for (const auto& n : floats) qm.set_enabled(n, false);
  std::int64_t same = 0, total = 0;
  for (const auto& x : d.holdout) {
    qm.set_quant(false, false);
    const at::Tensor f = qm.forward(x)[0];
    qm.set_quant(true, true);
    const at::Tensor q = qm.forward(x)[0];
    same += (f.argmax(-1) == q.argmax(-1)).sum().item<std::int64_t>();
    total += f.size(0);
  }
  qm.set_quant(false, false);
  for (const auto& n : floats) qm.set_enabled(n, true);
  return static_cast<double>(same) / static_cast<double>(total);
}

TEST(Target, ArgmaxAgreementIsReachedOnTheClassifier) {
  Fixture f = calibrated(kSabotaged, 64);
  const double none = agreement_with(f.qm, f.data, {});
  const double both = agreement_with(f.qm, f.data, {"/dw3/Conv", "/fc1/Gemm"});
  ASSERT_LT(none, both) << "the fixture needs the sabotaged layers to change some classes";
  char expr[64];
  std::snprintf(expr, sizeof expr, "argmax-agreement>=%.9f", both);
  TargetReport r = meet_target(f.qm, target(expr, {"float"}, 4), f.data);
  EXPECT_DOUBLE_EQ(r.before, none);
  EXPECT_TRUE(r.reached);
  EXPECT_GE(r.after, both);
  EXPECT_LE(r.fallback_layers.size(), 2U);
}

}  // namespace
}  // namespace sparsebit::target_tests
