// The sequence ops against ONNX Runtime, chained as models use them: a tensor split into a
// sequence, edited, read back and joined.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_testing.h"

namespace sparsebit::testing {
namespace {

class SequenceOps : public OrtOpTest {};

TEST_F(SequenceOps, SplitEditReadAndJoin) {
  Graph g;
  g.opset_imports[""] = 17;
  const at::Tensor x = at::randn({2, 5, 3}), t = at::randn({2, 4, 3});
  g.inputs = {value_of("x", &x), value_of("t", &t)};
  g.initializers["split"] = at::tensor({2, 3}, at::kLong);
  g.initializers["at"] = at::scalar_tensor(1, at::kLong);
  g.initializers["last"] = at::scalar_tensor(-1, at::kLong);
  g.append(make_node("split", "SplitToSequence", {"x", "split"}, {"parts"}, {{"axis", Attribute::of_int(1)}}));
  g.append(make_node("insert", "SequenceInsert", {"parts", "t", "at"}, {"edited"}));
  g.append(make_node("erase", "SequenceErase", {"edited", "last"}, {"fewer"}));
  g.append(make_node("count", "SequenceLength", {"edited"}, {"n"}));
  g.append(make_node("pick", "SequenceAt", {"edited", "last"}, {"tail"}));
  g.append(make_node("join", "ConcatFromSequence", {"fewer"}, {"joined"}, {{"axis", Attribute::of_int(1)}}));
  g.append(make_node("stack", "ConcatFromSequence", {"parts2"}, {"stacked"},
                     {{"axis", Attribute::of_int(0)}, {"new_axis", Attribute::of_int(1)}}));
  g.append(make_node("construct", "SequenceConstruct", {"x", "x"}, {"parts2"}));
  g.topological_sort();
  for (const char* o : {"joined", "n", "tail", "stacked"}) g.outputs.push_back(value_of(o));
  expect_graph_matches_ort(std::move(g), {{"x", x}, {"t", t}}, "sequence chain");
}

}  // namespace
}  // namespace sparsebit::testing
