// Sequence and optional values (Note [Sequence values]): SequenceConstruct, SequenceEmpty,
// SequenceAt, SequenceInsert, SequenceErase, SequenceLength, ConcatFromSequence,
// SplitToSequence, Optional, OptionalHasElement, OptionalGetElement. They move tensors around
// and quantize nothing.
//
// Note [Sequence values]
// The executor carries tensors only, so a sequence travels as one nested tensor (ATen's list of
// tensors of one rank and type, which keeps its element type even when empty), and an optional
// as its element, or an undefined tensor when it holds none. Elements of different ranks in one
// sequence (ONNX allows them, exporters do not write them) are refused with the node's name.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit::ops {
namespace {

// ATen marks nested tensors as a prototype with a one-time warning; the behaviour used here
// (build from a list, unbind) is what the warning is about, so it is not repeated to users.
class Quiet final : public c10::WarningHandler {
 public:
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning&) override {}
#else
  void process(const c10::SourceLocation&, const std::string&, bool) override {}
#endif
};
#if TORCH_VERSION_MAJOR >= 2
using QuietGuard = c10::WarningUtils::WarningHandlerGuard;
#else
using QuietGuard = c10::Warning::WarningHandlerGuard;
#endif

at::Tensor make_sequence(const std::vector<at::Tensor>& items, at::ScalarType dtype, const Node& n) {
  for (const auto& t : items)
    if (t.dim() != items.front().dim())
      throw Error(n.describe() + ": sequence elements of different ranks (" + std::to_string(items.front().dim()) +
                  " and " + std::to_string(t.dim()) + ") are not supported");
  static Quiet quiet;
  QuietGuard guard(&quiet);
  std::vector<at::Tensor> same;
  for (const auto& t : items) same.push_back(t.to(dtype).contiguous());
  return at::_nested_tensor_from_tensor_list(same, dtype);
}

std::vector<at::Tensor> elements(const at::Tensor& seq, const Node& n, const char* what) {
  if (!seq.defined() || !seq.is_nested()) throw Error(n.describe() + ": " + what + " is not a sequence");
  return seq.unbind();
}

std::int64_t position(const at::Tensor& t, std::int64_t size, bool insert, const Node& n) {
  auto v = int_list(t, n, "position");
  if (v.size() != 1) throw Error(n.describe() + ": position must be a scalar");
  std::int64_t p = v[0] < 0 ? v[0] + size : v[0];
  if (p < 0 || p > size || (!insert && p == size))
    throw Error(n.describe() + ": position " + std::to_string(v[0]) + " is out of range for a sequence of " +
                std::to_string(size));
  return p;
}

class SequenceOp : public NodeQModule {
 public:
  using NodeQModule::NodeQModule;
  std::vector<InputSpec> input_specs() const override { return {}; }
};

class QSequenceConstruct final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    if (in.empty()) throw Error(describe() + ": needs at least one input");
    return {make_sequence(in, in.front().scalar_type(), node())};
  }
};

class QSequenceEmpty final : public SequenceOp {
 public:
  explicit QSequenceEmpty(const OpContext& c)
      : SequenceOp(c), dtype_(scalar_type_of(c.node.attr_int("dtype", 1), c.node)) {}
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>&) override {
    return {make_sequence({}, dtype_, node())};
  }

 private:
  at::ScalarType dtype_;
};

class QSequenceAt final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    auto items = elements(in.at(0), node(), "input_sequence");
    return {
        items.at(static_cast<std::size_t>(position(in.at(1), static_cast<std::int64_t>(items.size()), false, node())))};
  }
};

class QSequenceInsert final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& seq = in.at(0);
    auto items = elements(seq, node(), "input_sequence");
    const auto size = static_cast<std::int64_t>(items.size());
    const std::int64_t p = in.size() > 2 && in[2].defined() ? position(in[2], size, true, node()) : size;
    if (in.at(1).scalar_type() != seq.scalar_type())
      throw Error(describe() + ": inserts a " + std::string(c10::toString(in[1].scalar_type())) + " tensor into a " +
                  std::string(c10::toString(seq.scalar_type())) + " sequence");
    items.insert(items.begin() + p, in[1]);
    return {make_sequence(items, seq.scalar_type(), node())};
  }
};

class QSequenceErase final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    auto items = elements(in.at(0), node(), "input_sequence");
    const auto size = static_cast<std::int64_t>(items.size());
    if (size == 0) throw Error(describe() + ": erases from an empty sequence");
    const std::int64_t p = in.size() > 1 && in[1].defined() ? position(in[1], size, false, node()) : size - 1;
    items.erase(items.begin() + p);
    return {make_sequence(items, in[0].scalar_type(), node())};
  }
};

class QSequenceLength final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const auto size = static_cast<std::int64_t>(elements(in.at(0), node(), "input_sequence").size());
    return {at::scalar_tensor(size, at::kLong)};
  }
};

class QConcatFromSequence final : public SequenceOp {
 public:
  explicit QConcatFromSequence(const OpContext& c)
      : SequenceOp(c), axis_(c.node.attr_int("axis", 0)), new_axis_(c.node.attr_int("new_axis", 0) != 0) {
    if (!c.node.has_attr("axis")) throw Error(describe() + ": attribute 'axis' is required");
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    auto items = elements(in.at(0), node(), "input_sequence");
    if (items.empty()) throw Error(describe() + ": concatenates an empty sequence");
    const std::int64_t rank = items.front().dim() + (new_axis_ ? 1 : 0);
    const std::int64_t axis = normalize_axis(axis_, rank, node());
    return {new_axis_ ? at::stack(items, axis) : at::cat(items, axis)};
  }

 private:
  std::int64_t axis_;
  bool new_axis_;
};

class QSplitToSequence final : public SequenceOp {
 public:
  explicit QSplitToSequence(const OpContext& c)
      : SequenceOp(c), axis_(c.node.attr_int("axis", 0)), keepdims_(c.node.attr_int("keepdims", 1) != 0) {}
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    const std::int64_t axis = normalize_axis(axis_, x.dim(), node());
    std::vector<at::Tensor> parts;
    if (in.size() > 1 && in[1].defined()) {
      auto split = int_list(in[1], node(), "split");
      if (in[1].dim() == 0) {  // a chunk length: the last chunk may be shorter
        if (split[0] <= 0) throw Error(describe() + ": split must be positive");
        parts = x.split(split[0], axis);
      } else {
        std::int64_t total = 0;
        for (auto s : split) total += s;
        if (total != x.size(axis))
          throw Error(describe() + ": split sums to " + std::to_string(total) + ", the axis has " +
                      std::to_string(x.size(axis)));
        parts = x.split_with_sizes(split, axis);
      }
    } else {
      parts = x.split(1, axis);  // one element per index
      if (!keepdims_)
        for (auto& p : parts) p = p.squeeze(axis);
    }
    return {make_sequence(parts, x.scalar_type(), node())};
  }

 private:
  std::int64_t axis_;
  bool keepdims_;
};

// Optional(x): x; Optional() with a type: no element.
class QOptional final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {in.empty() ? at::Tensor() : in[0]};
  }
};

class QOptionalHasElement final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    return {at::scalar_tensor(!in.empty() && in[0].defined(), at::kBool)};
  }
};

class QOptionalGetElement final : public SequenceOp {
 public:
  using SequenceOp::SequenceOp;
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    if (in.empty() || !in[0].defined()) throw Error(describe() + ": the optional holds no element");
    return {in[0]};
  }
};

void register_all(Registrar& r) {
  r.add_op<QSequenceConstruct>("SequenceConstruct");
  r.add_op<QSequenceEmpty>("SequenceEmpty");
  r.add_op<QSequenceAt>("SequenceAt");
  r.add_op<QSequenceInsert>("SequenceInsert");
  r.add_op<QSequenceErase>("SequenceErase");
  r.add_op<QSequenceLength>("SequenceLength");
  r.add_op<QConcatFromSequence>("ConcatFromSequence");
  r.add_op<QSplitToSequence>("SplitToSequence");
  r.add_op<QOptional>("Optional");
  r.add_op<QOptionalHasElement>("OptionalHasElement");
  r.add_op<QOptionalGetElement>("OptionalGetElement");
  for (const char* op : {"SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceInsert", "SequenceErase",
                         "SequenceLength", "ConcatFromSequence", "SplitToSequence"})
    r.add_op_traits<SameMeaning<>>(op);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.sequence", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
