// Opset lifting by per-op rules (Note [Opset lifting] in opset_lift.h).
#include "sparsebit/core/opset_lift.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "base/log.h"
#include "graph/value_facts.h"

#include "base/core_ops.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit {
namespace {

using detail::run_sample;

// The rules live with the ops (LiftsOpset, Note [Op traits]); the core walks the graph, holds the
// facts the rules read, and rewrites only its own control flow.
class Lifter final : public LiftContext {
 public:
  Lifter(Graph& g, const ValueFacts& facts, std::int64_t target, LiftReport& report)
      : g_(g), facts_(facts), target_(target), report_(report) {}

  Graph& graph() override { return g_; }
  std::int64_t target() const override { return target_; }
  std::int64_t rank(const std::string& value) const override {
    if (auto it = g_.initializers.find(value); it != g_.initializers.end()) return it->second.dim();
    const ValueFact* f = fact(value);
    return f ? f->rank : -1;
  }
  std::int32_t elem_type(const std::string& value) const override {
    if (auto it = g_.initializers.find(value); it != g_.initializers.end())
      return onnx_type_of(it->second.scalar_type());
    const ValueFact* f = fact(value);
    return f ? f->elem_type : 0;
  }
  std::vector<std::int64_t> dims(const std::string& value) const override {
    if (auto it = g_.initializers.find(value); it != g_.initializers.end()) return it->second.sizes().vec();
    const ValueFact* f = fact(value);
    return f ? f->dims : std::vector<std::int64_t>{};
  }
  void note(const Node& n, const std::string& what) override { report_.rewrites.push_back(n.describe() + ": " + what); }
  [[noreturn]] void refuse(const Node& n, const std::string& why) const override {
    throw Error(n.describe() + " cannot be lifted from opset " + std::to_string(report_.from) + " to " +
                std::to_string(target_) + ": " + why);
  }

 private:
  const ValueFact* fact(const std::string& value) const {
    auto it = facts_.find(value);
    return it == facts_.end() ? nullptr : &it->second;
  }

  Graph& g_;
  const ValueFacts& facts_;
  std::int64_t target_;
  LiftReport& report_;
};

const LiftsOpset& rules_of(const Lifter& l, const Node& n, const OpTraitTable& ops) {
  const OpTraitTable::Op* op = ops.find(n.op_type, n.domain);
  if (const auto* rules = op ? dynamic_cast<const LiftsOpset*>(op->traits.get()) : nullptr) return *rules;
  const std::string then = "; re-export the model at opset " + std::to_string(l.target()) + " or newer";
  l.refuse(n, op ? "plugin '" + op->plugin + "', which registers " + n.op_type +
                       ", gives no lifting rules for it (LiftsOpset, docs/PLUGINS.md)" + then
                 : "no loaded plugin registers " + n.op_type + " (see `sparsebit plugins`)" + then);
}

void lift_node(Lifter& l, Node& n, std::int64_t from, const OpTraitTable& rules) {
  for (const auto& a : n.attributes)
    if (a.second.kind == Attribute::Kind::kOpaque)
      l.refuse(n, "attribute '" + a.first + "' holds a list of subgraphs or another kind the lifter cannot rewrite");
  // Control flow is the core's own: If and Loop kept their meaning from opset 1 and 11, and
  // their bodies are lifted by lift_graph(), which also rewrites Scan-8.
  if (n.op_type == core_ops::kIf || n.op_type == core_ops::kLoop) return;
  if (n.op_type == core_ops::kScan) {
    if (from < 9 && n.has_input(0))
      l.refuse(n,
               "Scan-8 with sequence_lens (sequences of several lengths in one batch) has no Scan-9 form; "
               "re-export at opset 9 or newer");
    return;
  }
  std::int64_t version = rules_of(l, n, rules).read_as(from);
  for (;;) {
    const LiftsOpset& op = rules_of(l, n, rules);
    std::int64_t next = 0;
    for (std::int64_t v : op.lift_versions())
      if (v > version && v <= l.target()) {
        next = v;
        break;
      }
    if (!next) return;
    op.lift(l, n, next);  // may rename the op (Upsample -> Resize): the new op's rules continue from here
    version = next;
  }
}

std::string describe_sample(const std::vector<at::Tensor>& sample) {
  std::string s;
  for (const auto& t : sample) s += (s.empty() ? "" : ", ") + c10::str(t.sizes());
  return s;
}

}  // namespace

/// Lifts the default-domain nodes of `g` and, in the same way, of every subgraph in it. Names
/// are unique across nesting levels, so facts about enclosing values hold inside bodies; values
/// computed inside a body have none, and rules fall back to what needs no facts or refuse.
// Scan-8 runs its body over axis 1 of every scan input, for each batch entry (axis 0) apart;
// Scan-9 has no batch axis. So Scan-8 (without sequence_lens) becomes a Loop over the batch whose
// body takes entry i of every state and scan input (Gather on axis 0) and runs a Scan-9 over
// them with the original body; the Loop stacks the final states and the scan outputs of all
// entries along axis 0, which is Scan-8's layout. Called once the original body is lifted.
void scan8_to_loop(Lifter& l, Node& n) {
  Graph& g = l.graph();
  const std::int64_t m = n.attr_int("num_scan_inputs", 0);
  const std::size_t states = n.inputs.size() - 1 - static_cast<std::size_t>(m);
  if (m < 1 || n.inputs.size() < 1 + static_cast<std::size_t>(m)) l.refuse(n, "num_scan_inputs is out of range");
  std::shared_ptr<Graph> original = n.attributes.at("body").graph;
  auto node = [](const std::string& name, std::string_view op, std::vector<std::string> in,
                 std::vector<std::string> out) {
    Node x;
    x.name = name;
    x.op_type = std::string(op);
    x.inputs = std::move(in);
    x.outputs = std::move(out);
    return x;
  };
  // The batch size: dim 0 of the first scan input.
  const std::string shape = g.unique_name(n.name + "_input_shape"), batch = g.unique_name(n.name + "_batch");
  g.insert_before(&n, node(g.unique_name(n.name + "_Shape"), core_ops::kShape, {n.inputs[1 + states]}, {shape}));
  Node first = node(g.unique_name(n.name + "_Gather"), core_ops::kGather,
                    {shape, l.constant(n, "zero", at::scalar_tensor(0, at::kLong))}, {batch});
  g.insert_before(&n, std::move(first));

  Graph body;
  body.opset_imports = g.opset_imports;
  body.opset_imports[""] = l.target();
  const std::string iter = g.unique_name(n.name + "_entry"), cond_in = g.unique_name(n.name + "_cond_in"),
                    cond_out = g.unique_name(n.name + "_cond_out");
  body.inputs = {{iter, 7, true, {}, ""}, {cond_in, 9, true, {}, ""}};
  body.outputs = {{cond_out, 9, true, {}, ""}};
  body.append(node(g.unique_name(n.name + "_keep_going"), core_ops::kIdentity, {cond_in}, {cond_out}));
  Node scan = node(g.unique_name(n.name + "_per_entry"), core_ops::kScan, {}, {});
  for (std::size_t j = 1; j < n.inputs.size(); ++j) {  // entry i of every state and scan input
    const std::string entry = g.unique_name(n.inputs[j] + "_entry");
    body.append(
        node(g.unique_name(n.name + "_take_" + std::to_string(j)), core_ops::kGather, {n.inputs[j], iter}, {entry}));
    scan.inputs.push_back(entry);
  }
  for (std::size_t k = 0; k < original->outputs.size(); ++k) {
    const std::string out = g.unique_name(n.outputs.at(k) + "_entry");
    scan.outputs.push_back(out);
    body.outputs.push_back({out, original->outputs[k].elem_type, false, {}, ""});
  }
  scan.attributes["num_scan_inputs"] = Attribute::of_int(m);
  if (n.has_attr("directions")) scan.attributes["scan_input_directions"] = n.attributes.at("directions");
  scan.attributes["body"].kind = Attribute::Kind::kGraph;
  scan.attributes["body"].graph = original;
  body.append(std::move(scan));

  n.op_type = core_ops::kLoop;
  n.inputs = {batch, ""};
  n.attributes.clear();
  n.attributes["body"] = Attribute::of_graph(std::move(body));
  l.note(n, "Scan-8 -> Loop over the batch of a Scan-9 (" + std::to_string(states) + " states, " + std::to_string(m) +
                " scan inputs)");
}

void lift_graph(Graph& g, const ValueFacts& facts, std::int64_t target, LiftReport& report, std::int64_t from,
                const OpTraitTable& rules) {
  Lifter l(g, facts, target, report);
  for (Node* n : g.nodes()) {
    if (!n->domain.empty()) continue;
    lift_node(l, *n, from, rules);
    for (auto& kv : n->attributes) {
      if (kv.second.kind != Attribute::Kind::kGraph || !kv.second.graph) continue;
      lift_graph(*kv.second.graph, facts, target, report, from, rules);
      kv.second.graph->topological_sort();
    }
    if (n->op_type == core_ops::kScan && from < 9) scan8_to_loop(l, *n);
  }
  g.opset_imports[""] = target;
}

LiftReport lift_opset(Graph& graph, std::int64_t target, const OpTraitTable& rules, const ValueFacts& facts) {
  LiftReport report;
  report.from = graph.default_opset();
  report.to = std::max(report.from, target);
  if (report.from >= target) return report;
  if (report.from < kMinLiftableOpset)
    throw Error("opset " + std::to_string(report.from) + " is older than the lifting rules start (" +
                std::to_string(kMinLiftableOpset) + ")");
  Graph lifted = graph.clone();  // all or nothing: the caller's graph changes only on success
  lift_graph(lifted, facts, target, report, report.from, rules);
  lifted.topological_sort();
  lifted.validate();
  graph = std::move(lifted);
  return report;
}

LiftReport lift_model(Model& model, std::int64_t target, const Registry& registry,
                      const std::vector<at::Tensor>& sample) {
  const std::int64_t from = model.graph.default_opset();
  if (from >= target) return LiftReport{from, from, {}, false, 0};
  ValueFacts facts = static_value_facts(model.graph, model.meta.value_info);
  std::vector<at::Tensor> before;
  if (!sample.empty()) {
    ValueFacts observed;
    before = run_sample(model.graph, registry, sample, &observed);
    for (auto& [name, f] : observed) facts[name] = f;
  }
  Graph lifted = model.graph.clone();
  LiftReport report;
  try {
    report = lift_opset(lifted, target, OpTraitTable(registry), facts);
  } catch (const Error& e) {
    throw Error(model.meta.source_path + ": " + e.what());
  }
  if (!sample.empty()) {
    const auto after = run_sample(lifted, registry, sample, nullptr);
    for (std::size_t i = 0; i < before.size(); ++i) {
      const at::Tensor& a = before[i];
      const at::Tensor& b = after.at(i);
      bool same = a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type();
      double diff = 0;
      if (same && a.is_floating_point()) {
        const at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
        diff = d.numel() ? d.max().item<double>() : 0;
        const double scale = a.numel() ? a.abs().max().item<double>() : 0;
        same = !std::isnan(diff) && diff <= 1e-5 * (1 + scale);  // reassociated reductions only
      } else if (same) {
        same = at::equal(a, b);
      }
      report.max_abs_diff = std::max(report.max_abs_diff, diff);
      if (!same) {
        throw Error(model.meta.source_path + ": lifting from opset " + std::to_string(from) + " to " +
                    std::to_string(target) + " changed graph output '" + lifted.outputs[i].name +
                    "' on a sample of shape " + describe_sample(sample) + " (max |difference| " + c10::str(diff) +
                    "); re-export the model at opset " + std::to_string(target) + " and report this model");
      }
    }
    report.checked = true;
  }
  model.graph = std::move(lifted);
  return report;
}

namespace {

/// The model's typed inputs and outputs without a shape, each with "input" or "output".
std::vector<std::pair<const char*, ValueInfo*>> shapeless_io(Graph& g) {
  std::vector<std::pair<const char*, ValueInfo*>> out;
  for (auto& v : g.inputs)
    if (v.elem_type != 0 && !v.has_shape) out.emplace_back("input", &v);
  for (auto& v : g.outputs)
    if (v.elem_type != 0 && !v.has_shape) out.emplace_back("output", &v);
  return out;
}

// Note [Inputs and outputs without a shape]
// Some exporters declare a model input or output with its element type alone. ONNX Runtime
// reads such a model, but ONNX's checker requires a shape on every input and output of the
// main graph (its dims may be unknown), so the export would be refused after all the work.
// The rank is taken from one sample of the calibration data; the dims are written unknown,
// since one sample cannot say which of them vary.
void give_io_ranks(Model& model, const Registry& registry, const std::vector<at::Tensor>& sample,
                   const std::string& path) {
  const auto shapeless = shapeless_io(model.graph);
  if (shapeless.empty()) return;
  if (sample.empty())
    throw Error(path + ": " + shapeless[0].first + " '" + printable(shapeless[0].second->name) +
                "' declares its element type but no shape, which ONNX's checker requires of a model's inputs and "
                "outputs: declare its shape in the model (dims may be symbolic), or give calibration data, from "
                "which its rank is taken");
  const std::vector<at::Tensor> outputs = detail::run_sample(model.graph, registry, sample, nullptr);
  auto set_rank = [&](ValueInfo& v, const at::Tensor& t, const char* what) {
    if (v.elem_type == 0 || v.has_shape || !t.defined()) return;
    v.has_shape = true;
    v.shape.assign(static_cast<std::size_t>(t.dim()), Dim{});
    logs::info("{}", path + ": " + what + " '" + v.name + "' declares no shape; written with rank " +
                         std::to_string(t.dim()) + " (dims unknown), as one sample has it");
  };
  for (std::size_t i = 0; i < model.graph.inputs.size() && i < sample.size(); ++i)
    set_rank(model.graph.inputs[i], sample[i], "input");
  for (std::size_t i = 0; i < model.graph.outputs.size() && i < outputs.size(); ++i)
    set_rank(model.graph.outputs[i], outputs[i], "output");
}

}  // namespace

Model load_and_lift(const std::string& path, const Registry& registry, const DataSource& calib, std::int64_t target) {
  Model model = load_onnx(path, ImportOptions{0, &registry, /*half_in_float=*/true});
  const bool lift = model.graph.default_opset() < target;
  if (!lift && shapeless_io(model.graph).empty()) return model;
  Executor check(model.graph, registry);  // an op without a QModule is named before the data is read
  const std::vector<at::Tensor> sample = calib.empty() ? std::vector<at::Tensor>{} : sample_inputs(model.graph, calib);
  give_io_ranks(model, registry, sample, path);
  if (!lift) return model;
  const LiftReport r = lift_model(model, target, registry, sample);
  logs::info("{}", path + ": lifted from opset " + std::to_string(r.from) + " to " + std::to_string(r.to) + " (" +
                       std::to_string(r.rewrites.size()) + " node rewrites" +
                       (r.checked ? ", outputs checked on one sample: max |difference| " + c10::str(r.max_abs_diff)
                                  : std::string(", not checked: no calibration data")) +
                       ")");
  for (const auto& line : r.rewrites) logs::debug("{}", "  " + line);
  return model;
}

}  // namespace sparsebit
