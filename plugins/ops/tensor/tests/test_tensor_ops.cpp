// The data-movement ops against ONNX Runtime with what exporters' Shape/Slice/Gather chains
// use: negative steps and indices, batch dimensions, reductions in scatters, padding modes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit::testing {
namespace {

class TensorOps : public OrtOpTest {};

at::Tensor i64(std::vector<std::int64_t> v) { return at::tensor(v, at::kLong); }

TEST_F(TensorOps, SlicesGathersAndScatters) {
  const at::Tensor x = at::randn({4, 5, 6});
  expect_matches_ort(
      {"Slice",
       "",
       {},
       {{"x", x}, {"starts", i64({-1, 1})}, {"ends", i64({-100, 6})}, {"axes", i64({0, 2})}, {"steps", i64({-2, 2})}},
       {"y"}},
      0);
  expect_matches_ort(
      {"Gather", "", {{"axis", Attribute::of_int(1)}}, {{"x", x}, {"i", i64({-1, 0, 3, -5}).reshape({2, 2})}}, {"y"}},
      0);
  expect_matches_ort({"GatherElements",
                      "",
                      {{"axis", Attribute::of_int(2)}},
                      {{"x", x}, {"i", at::randint(-6, 6, {4, 5, 3}, at::kLong)}},
                      {"y"}},
                     0);
  expect_matches_ort({"GatherND",
                      "",
                      {{"batch_dims", Attribute::of_int(1)}},
                      {{"x", x}, {"i", at::randint(0, 5, {4, 3, 1}, at::kLong)}},
                      {"y"}},
                     0);
  for (const char* reduction : {"none", "add", "mul"})
    expect_matches_ort({"ScatterElements",
                        "",
                        {{"axis", Attribute::of_int(1)}, {"reduction", Attribute::of_string(reduction)}},
                        {{"x", x},
                         {"i", at::tensor({0, 2, 4}, at::kLong).reshape({1, 3, 1}).expand({4, 3, 6}).contiguous()},
                         {"u", at::randn({4, 3, 6})}},
                        {"y"},
                        16},
                       1e-5);
  expect_matches_ort({"ScatterND",
                      "",
                      {{"reduction", Attribute::of_string("add")}},
                      {{"x", x}, {"i", i64({1, 3, 1}).reshape({3, 1})}, {"u", at::randn({3, 5, 6})}},
                      {"y"},
                      16});
}

TEST_F(TensorOps, PaddingTilingAndShapes) {
  const at::Tensor x = at::randn({2, 3, 4, 5});
  for (const char* mode : {"constant", "reflect", "edge"})
    expect_matches_ort({"Pad",
                        "",
                        {{"mode", Attribute::of_string(mode)}},
                        {{"x", x}, {"pads", i64({0, 0, 1, 2, 0, 1, 2, 1})}, {"v", at::scalar_tensor(0.5)}},
                        {"y"}},
                       0);
  expect_matches_ort({"Tile", "", {}, {{"x", x}, {"r", i64({1, 2, 1, 3})}}, {"y"}}, 0);
  expect_matches_ort({"Expand", "", {}, {{"x", at::randn({3, 1, 5})}, {"s", i64({2, 1, 4, 1})}}, {"y"}}, 0);
  expect_matches_ort(
      {"Trilu", "", {{"upper", Attribute::of_int(0)}}, {{"x", x}, {"k", at::scalar_tensor(1, at::kLong)}}, {"y"}}, 0);
  expect_matches_ort({"DepthToSpace",
                      "",
                      {{"blocksize", Attribute::of_int(2)}, {"mode", Attribute::of_string("CRD")}},
                      {{"x", at::randn({1, 8, 2, 3})}},
                      {"y"}},
                     0);
  expect_matches_ort(
      {"SpaceToDepth", "", {{"blocksize", Attribute::of_int(2)}}, {{"x", at::randn({1, 2, 4, 6})}}, {"y"}}, 0);
  expect_matches_ort({"Flatten", "", {{"axis", Attribute::of_int(-2)}}, {{"x", x}}, {"y"}}, 0);
  expect_matches_ort({"Split", "", {{"axis", Attribute::of_int(3)}}, {{"x", x}, {"s", i64({1, 4})}}, {"a", "b"}}, 0);
}

TEST_F(TensorOps, DataDependentShapes) {
  const at::Tensor x = at::tensor({1.0f, 0.0f, 3.0f, 3.0f, 0.0f, -2.0f, 1.0f, 5.0f}).reshape({2, 4});
  expect_matches_ort({"NonZero", "", {}, {{"x", x}}, {"y"}}, 0);
  expect_matches_ort(
      {"Unique", "", {{"sorted", Attribute::of_int(1)}}, {{"x", x}}, {"y", "indices", "inverse", "counts"}}, 0);
  expect_matches_ort(
      {"Compress", "", {{"axis", Attribute::of_int(1)}}, {{"x", x}, {"c", at::tensor({1, 0, 1}).to(at::kBool)}}, {"y"}},
      0);
  expect_matches_ort(
      {"OneHot",
       "",
       {{"axis", Attribute::of_int(-1)}},
       {{"i", i64({0, -1, 2, 4})}, {"depth", at::scalar_tensor(5, at::kLong)}, {"values", at::tensor({-1.0f, 2.0f})}},
       {"y"}},
      0);
  expect_matches_ort({"Range",
                      "",
                      {},
                      {{"a", at::scalar_tensor(1.0)}, {"b", at::scalar_tensor(-4.0)}, {"d", at::scalar_tensor(-1.5)}},
                      {"y"}},
                     1e-6);
  expect_matches_ort({"ReverseSequence",
                      "",
                      {{"batch_axis", Attribute::of_int(1)}, {"time_axis", Attribute::of_int(0)}},
                      {{"x", at::randn({4, 3, 2})}, {"l", i64({4, 2, 1})}},
                      {"y"}},
                     0);
}

}  // namespace
}  // namespace sparsebit::testing

namespace sparsebit::testing {
namespace {

/// Where the shipped ChannelFlow trait of `n`'s op sends channels on axis `axis` of input 0,
/// whose shape is `in`; output 0 has shape `out`; `constants` are initializers the node reads.
ChannelFlowAnswer flow(const Node& n, const std::vector<std::int64_t>& in, const std::vector<std::int64_t>& out,
                       std::int64_t axis, const std::map<std::string, at::Tensor>& constants = {}) {
  Graph g;
  g.opset_imports[""] = 17;
  g.initializers = constants;
  const std::map<std::string, std::vector<std::int64_t>> shapes = {{n.inputs[0], in}, {n.outputs[0], out}};
  const auto* trait = shipped_registry().op_trait<ChannelFlow>(n.op_type, "");
  if (!trait) throw Error("no ChannelFlow for " + n.op_type);
  return trait->channel_flow(ChannelQuery{n, g, 17, 0, axis, in[static_cast<std::size_t>(axis)],
                                          [&](const std::string& v) {
                                            auto it = shapes.find(v);
                                            return it == shapes.end() ? nullptr : &it->second;
                                          },
                                          [&](const std::string& v) -> std::optional<at::Tensor> {
                                            auto it = constants.find(v);
                                            return it == constants.end() ? std::nullopt
                                                                         : std::optional<at::Tensor>(it->second);
                                          }});
}

/// The output axes of an answer, one per carried output.
std::vector<std::int64_t> axes(const ChannelFlowAnswer& a) {
  std::vector<std::int64_t> out;
  for (const auto& o : a.outputs) out.push_back(o.axis);
  return out;
}

using Axes = std::vector<std::int64_t>;

TEST(TensorOpTraits, ChannelsMoveWithTheAxesThatOpsInsertRemoveAndPermute) {
  // Unsqueeze's negative axes count in the output's rank: -1 on a rank-3 input inserts axis 3,
  // so channels on axis 2 stay there; -3 inserts axis 1 and moves them to 3.
  const Node unsq = make_node("u", "Unsqueeze", {"x", "axes"}, {"y"});
  EXPECT_EQ(axes(flow(unsq, {1, 4, 8}, {1, 4, 8, 1}, 2, {{"axes", at::tensor(Axes{-1})}})), Axes{2});
  EXPECT_EQ(axes(flow(unsq, {1, 4, 8}, {1, 1, 4, 8}, 2, {{"axes", at::tensor(Axes{-3})}})), Axes{3});
  // Squeeze of an axis before the channels shifts them; of the channel axis itself keeps them.
  const Node sq = make_node("s", "Squeeze", {"x", "axes"}, {"y"});
  EXPECT_EQ(axes(flow(sq, {1, 1, 8}, {1, 8}, 2, {{"axes", at::tensor(Axes{1})}})), Axes{1});
  EXPECT_TRUE(flow(sq, {1, 8, 1}, {1, 8}, 1, {{"axes", at::tensor(Axes{})}}).outputs.empty());
  // Transpose: perm [0, 2, 3, 1] puts axis 1 at position 3; no perm reverses the axes.
  EXPECT_EQ(axes(flow(make_node("t", "Transpose", {"x"}, {"y"}, {{"perm", Attribute::of_ints({0, 2, 3, 1})}}),
                      {1, 8, 2, 3}, {1, 2, 3, 8}, 1)),
            Axes{3});
  EXPECT_EQ(axes(flow(make_node("t", "Transpose", {"x"}, {"y"}), {1, 8, 2, 3}, {3, 2, 8, 1}, 1)), Axes{2});
}

TEST(TensorOpTraits, ChannelsPassOnlyWhenTheirAxisIsNotCutPaddedOrSplit) {
  const Node slice = make_node("s", "Slice", {"x", "starts", "ends", "axes"}, {"y"});
  const std::map<std::string, at::Tensor> on_w = {
      {"starts", at::tensor(Axes{0})}, {"ends", at::tensor(Axes{2})}, {"axes", at::tensor(Axes{-1})}};
  EXPECT_EQ(axes(flow(slice, {1, 8, 4, 4}, {1, 8, 4, 2}, 1, on_w)), Axes{1});
  std::map<std::string, at::Tensor> on_c = on_w;
  on_c["axes"] = at::tensor(Axes{1});
  EXPECT_TRUE(flow(slice, {1, 8, 4, 4}, {1, 2, 4, 4}, 1, on_c).outputs.empty());
  const Node pad = make_node("p", "Pad", {"x", "pads"}, {"y"});
  EXPECT_EQ(axes(flow(pad, {1, 8, 4, 4}, {1, 8, 6, 6}, 1, {{"pads", at::tensor(Axes{0, 0, 1, 1, 0, 0, 1, 1})}})),
            Axes{1});
  EXPECT_TRUE(
      flow(pad, {1, 8, 4, 4}, {1, 9, 4, 4}, 1, {{"pads", at::tensor(Axes{0, 1, 0, 0, 0, 0, 0, 0})}}).outputs.empty());
  // Split along the width: both outputs carry the channels.
  const Node split = make_node("s", "Split", {"x"}, {"y", "z"}, {{"axis", Attribute::of_int(3)}});
  EXPECT_EQ(axes(flow(split, {1, 8, 4, 4}, {1, 8, 4, 2}, 1)), (Axes{1, 1}));
  const Node split_c = make_node("s", "Split", {"x"}, {"y", "z"}, {{"axis", Attribute::of_int(1)}});
  EXPECT_TRUE(flow(split_c, {1, 8, 4, 4}, {1, 4, 4, 4}, 1).outputs.empty());
}

}  // namespace
}  // namespace sparsebit::testing
