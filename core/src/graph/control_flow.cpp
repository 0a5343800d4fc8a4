// Running If, Loop and Scan: their bodies' executors fed from the enclosing scope
// (Executor::run_control_flow).

#include <ATen/ATen.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "graph/control_flow.h"
#include "sparsebit/sdk/error.h"
#include "base/core_ops.h"

namespace sparsebit {
namespace {

// A Loop without a trip count runs while its condition holds; any Loop stops with an error past
// 2^24 iterations (SPARSEBIT_MAX_LOOP_ITERATIONS changes it), so a condition that never turns
// false is a message, not a hang.
constexpr std::int64_t kUnboundedLoop = std::numeric_limits<std::int64_t>::max();

std::int64_t max_loop_iterations() {
  static const std::int64_t limit = [] {
    const char* v = std::getenv("SPARSEBIT_MAX_LOOP_ITERATIONS");
    if (!v || !*v) return std::int64_t{1} << 24;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v, &end, 10);
    if (errno || *end || x < 1)
      throw Error("SPARSEBIT_MAX_LOOP_ITERATIONS='" + printable(v, 40) + "' is not a whole number of at least 1");
    return static_cast<std::int64_t>(x);
  }();
  return limit;
}

std::int64_t scalar_of(const at::Tensor& t, const Node& n, const char* what) {
  if (!t.defined() || t.numel() != 1) throw Error(n.describe() + ": " + what + " must hold exactly one value");
  return t.reshape({}).to(at::kCPU).to(at::kLong).item<std::int64_t>();
}

/// What one control-flow node runs: its body, its inputs, the hook, and the enclosing scope.
struct BodyRun {
  Executor& body;
  const Node& n;
  const std::vector<at::Tensor>& inputs;
  const Executor::InputHook& hook;
  const std::map<std::string, at::Tensor>& scope;
  std::int64_t opset;  ///< the enclosing graph's default opset
  at::Tensor input(std::size_t i) const { return i < inputs.size() ? inputs[i] : at::Tensor(); }
  std::vector<at::Tensor> once(const std::map<std::string, at::Tensor>& feeds) const {
    return body.run(feeds, hook, &scope);
  }
};

/// SequenceMap: the body once per element of the sequences (Note [Sequence values]).
std::vector<at::Tensor> run_sequence_map(const BodyRun& r) {
  const Node& n = r.n;
  const auto& inputs = r.inputs;
  const Graph& bg = r.body.graph();
  std::vector<at::Tensor> result;
  if (inputs.empty() || !r.input(0).defined() || !r.input(0).is_nested())
    throw Error(n.describe() + ": its first input must be a sequence");
  if (bg.inputs.size() != inputs.size())
    throw Error(n.describe() + ": its body takes " + std::to_string(bg.inputs.size()) + " inputs for " +
                std::to_string(inputs.size()) + " node inputs");
  std::vector<std::vector<at::Tensor>> items(inputs.size());
  for (std::size_t j = 0; j < inputs.size(); ++j)
    if (inputs[j].defined() && inputs[j].is_nested()) items[j] = inputs[j].unbind();
  const std::size_t length = items[0].size();
  for (std::size_t j = 1; j < inputs.size(); ++j)
    if (!items[j].empty() && items[j].size() != length) throw Error(n.describe() + ": its sequences differ in length");
  std::vector<std::vector<at::Tensor>> outs(bg.outputs.size());
  for (std::size_t i = 0; i < length; ++i) {
    std::map<std::string, at::Tensor> feeds;
    for (std::size_t j = 0; j < inputs.size(); ++j)
      feeds[bg.inputs[j].name] = inputs[j].defined() && inputs[j].is_nested() ? items[j][i] : inputs[j];
    auto out = r.once(feeds);
    for (std::size_t k = 0; k < out.size() && k < outs.size(); ++k) outs[k].push_back(out[k]);
  }
  for (std::size_t k = 0; k < outs.size(); ++k) {
    // An empty result keeps the element type the body declares (float when it declares none).
    const at::ScalarType dtype = !outs[k].empty()               ? outs[k][0].scalar_type()
                                 : bg.outputs[k].elem_type == 7 ? at::kLong
                                                                : at::kFloat;
    result.push_back(sequence_of(outs[k], dtype));
  }
  return result;
}

/// Loop: while the trip count lasts and the condition holds, carrying values and stacking scans.
std::vector<at::Tensor> run_loop(const BodyRun& r) {
  const Node& n = r.n;
  const auto& inputs = r.inputs;
  const Graph& bg = r.body.graph();
  std::vector<at::Tensor> result;
  const bool has_trips = r.input(0).defined(), has_cond = r.input(1).defined();
  if (!has_trips && !has_cond)
    throw Error(n.describe() + ": a Loop with neither a trip count nor a condition never ends");
  // ONNX's Loop runs a negative trip count zero times (a bound, not "unbounded").
  const std::int64_t trips =
      has_trips ? std::max<std::int64_t>(0, scalar_of(r.input(0), n, "the trip count M")) : kUnboundedLoop;
  const std::size_t carried_count = inputs.size() > 2 ? inputs.size() - 2 : 0;
  if (bg.inputs.size() != 2 + carried_count || bg.outputs.size() < 1 + carried_count)
    throw Error(n.describe() + ": its body takes " + std::to_string(bg.inputs.size()) + " inputs and gives " +
                std::to_string(bg.outputs.size()) + " outputs for " + std::to_string(carried_count) +
                " loop-carried values (expected 2 + N inputs, 1 + N + K outputs)");
  const std::size_t scan_count = bg.outputs.size() - 1 - carried_count;
  std::vector<at::Tensor> carried(inputs.begin() + 2, inputs.end());
  std::vector<std::vector<at::Tensor>> scans(scan_count);
  if (has_trips && !has_cond && trips > max_loop_iterations())  // it would run to the bound, then fail
    throw Error(n.describe() + ": trip count " + std::to_string(trips) + " is beyond the " +
                std::to_string(max_loop_iterations()) +
                " iterations a Loop may run; check the data that feeds the trip count, or allow more with "
                "SPARSEBIT_MAX_LOOP_ITERATIONS");
  at::Tensor cond = has_cond ? r.input(1) : at::ones({}, at::kBool);
  bool going = scalar_of(cond, n, "the condition") != 0;
  for (std::int64_t i = 0; going && i < trips; ++i) {
    if (i == max_loop_iterations())
      throw Error(n.describe() + ": still running after " + std::to_string(max_loop_iterations()) +
                  " iterations (trip count " + (has_trips ? std::to_string(trips) : std::string("none")) +
                  ", condition still true); a calibration sample should not loop this long: check the data "
                  "that feeds the trip count and the condition, or allow more with "
                  "SPARSEBIT_MAX_LOOP_ITERATIONS");
    std::map<std::string, at::Tensor> feeds{{bg.inputs[0].name, at::full({}, i, at::kLong)}, {bg.inputs[1].name, cond}};
    for (std::size_t j = 0; j < carried_count; ++j) feeds[bg.inputs[2 + j].name] = carried[j];
    auto out = r.once(feeds);
    cond = out[0];
    going = scalar_of(cond, n, "the body's condition output") != 0;
    for (std::size_t j = 0; j < carried_count; ++j) carried[j] = out[1 + j];
    for (std::size_t k = 0; k < scan_count; ++k) scans[k].push_back(out[1 + carried_count + k]);
  }
  result = carried;
  for (auto& s : scans) result.push_back(s.empty() ? at::empty({0}) : at::stack(s, 0));
  return result;
}

/// Scan; Scan-8 (opset < 9) puts a batch on axis 0 and runs each entry apart, along axis 1.
std::vector<at::Tensor> run_scan(const BodyRun& r) {
  const Node& n = r.n;
  const auto& inputs = r.inputs;
  const Graph& bg = r.body.graph();
  std::vector<at::Tensor> result;
  const bool batched = r.opset < 9;
  if (batched && r.input(0).defined())
    throw Error(n.describe() +
                ": Scan-8's sequence_lens (sequences of several lengths in one batch) is not "
                "supported; re-export at opset 9 or newer");
  const std::vector<at::Tensor> operands(inputs.begin() + (batched ? 1 : 0), inputs.end());
  const std::int64_t m = n.attr_int("num_scan_inputs", 0);
  if (m < 1 || m > static_cast<std::int64_t>(operands.size()))
    throw Error(n.describe() + ": num_scan_inputs must lie in 1.." + std::to_string(operands.size()));
  const std::size_t states = operands.size() - static_cast<std::size_t>(m);
  if (bg.inputs.size() != operands.size() || bg.outputs.size() < states)
    throw Error(n.describe() + ": its body takes " + std::to_string(bg.inputs.size()) + " inputs for " +
                std::to_string(operands.size()) + " node inputs");
  const std::size_t scan_out = bg.outputs.size() - states;
  auto per = [&](const char* key, std::size_t count) {
    auto v = n.attr_ints(key, std::vector<std::int64_t>(count, 0));
    if (v.size() != count)
      throw Error(n.describe() + ": " + key + " has " + std::to_string(v.size()) + " entries, " +
                  std::to_string(count) + " expected");
    return v;
  };
  const auto in_axes = per("scan_input_axes", static_cast<std::size_t>(m));
  const auto in_dirs = per(batched ? "directions" : "scan_input_directions", static_cast<std::size_t>(m));
  const auto out_axes = per("scan_output_axes", scan_out);
  const auto out_dirs = per("scan_output_directions", scan_out);
  auto scan = [&](const std::vector<at::Tensor>& xs) {  // one Scan-9 run
    std::vector<at::Tensor> seqs;
    std::vector<std::int64_t> axes;
    std::int64_t length = -1;
    for (std::size_t k = 0; k < static_cast<std::size_t>(m); ++k) {
      const at::Tensor& x = xs[states + k];
      std::int64_t axis = in_axes[k] < 0 ? in_axes[k] + x.dim() : in_axes[k];
      if (axis < 0 || axis >= x.dim()) throw Error(n.describe() + ": scan_input_axes is out of range");
      if (length >= 0 && x.size(axis) != length)
        throw Error(n.describe() + ": scan inputs differ in length along their scan axes");
      length = x.size(axis);
      seqs.push_back(x);
      axes.push_back(axis);
    }
    std::vector<at::Tensor> state(xs.begin(), xs.begin() + static_cast<long>(states));
    std::vector<std::vector<at::Tensor>> scans(scan_out);
    for (std::int64_t t = 0; t < length; ++t) {
      std::map<std::string, at::Tensor> feeds;
      for (std::size_t j = 0; j < states; ++j) feeds[bg.inputs[j].name] = state[j];
      for (std::size_t k = 0; k < seqs.size(); ++k)
        feeds[bg.inputs[states + k].name] = seqs[k].select(axes[k], in_dirs[k] ? length - 1 - t : t);
      auto out = r.once(feeds);
      for (std::size_t j = 0; j < states; ++j) state[j] = out[j];
      for (std::size_t k = 0; k < scan_out; ++k) scans[k].push_back(out[states + k]);
    }
    std::vector<at::Tensor> outs = state;
    for (std::size_t k = 0; k < scan_out; ++k) {
      if (scans[k].empty()) {
        outs.push_back(at::empty({0}));
        continue;
      }
      if (out_dirs[k]) std::reverse(scans[k].begin(), scans[k].end());
      const std::int64_t rank = scans[k][0].dim() + 1;
      std::int64_t axis = out_axes[k] < 0 ? out_axes[k] + rank : out_axes[k];
      if (axis < 0 || axis >= rank) throw Error(n.describe() + ": scan_output_axes is out of range");
      outs.push_back(at::stack(scans[k], axis));
    }
    return outs;
  };
  if (!batched) {
    result = scan(operands);
  } else {
    const std::int64_t entries = operands[states].dim() > 0 ? operands[states].size(0) : 0;
    if (entries == 0) throw Error(n.describe() + ": Scan-8 needs a batch axis with at least one entry");
    std::vector<std::vector<at::Tensor>> per_entry(states + scan_out);
    for (std::int64_t b = 0; b < entries; ++b) {
      std::vector<at::Tensor> xs;
      for (const auto& x : operands) xs.push_back(x.select(0, b));
      auto outs = scan(xs);
      for (std::size_t k = 0; k < outs.size(); ++k) per_entry[k].push_back(outs[k]);
    }
    for (auto& p : per_entry) result.push_back(at::stack(p, 0));
  }
  return result;
}

}  // namespace

std::map<std::string, at::Tensor> Executor::scope_of(std::size_t index,
                                                     const std::map<std::string, at::Tensor>& values) const {
  std::map<std::string, at::Tensor> scope;
  for (const auto& name : implicit_inputs(index)) {
    if (auto c = constants_.find(name); c != constants_.end()) scope[name] = c->second;
    else if (auto v = values.find(name); v != values.end()) scope[name] = v->second;
  }
  return scope;
}

std::vector<at::Tensor> Executor::run_control_flow(std::size_t index, const std::vector<at::Tensor>& inputs,
                                                   const std::map<std::string, at::Tensor>& scope,
                                                   const InputHook& hook) {
  const Node& n = graph_.node(index);
  ControlFlow& cf = *control_.at(index);
  for (const auto& name : cf.implicit)
    if (!scope.count(name)) throw Error(n.describe() + ": its subgraphs read '" + name + "', which was not given");
  auto input = [&](std::size_t i) { return i < inputs.size() ? inputs[i] : at::Tensor(); };
  auto check_outputs = [&](const std::vector<at::Tensor>& out, std::size_t want, const char* what) {
    if (out.size() != want)
      throw Error(n.describe() + ": its " + what + " gives " + std::to_string(out.size()) + " outputs, " +
                  std::to_string(want) + " expected");
  };
  if (n.op_type == core_ops::kIf) {
    const bool taken = scalar_of(input(0), n, "the condition") != 0;
    auto out = cf.bodies.at(taken ? "then_branch" : "else_branch")->run({}, hook, &scope);
    check_outputs(out, n.outputs.size(), taken ? "then_branch" : "else_branch");
    return out;
  }
  const BodyRun run{*cf.bodies.at("body"), n, inputs, hook, scope, graph_.default_opset()};
  const std::vector<at::Tensor> result = core_ops::is(n, core_ops::kSequenceMap) ? run_sequence_map(run)
                                         : core_ops::is(n, core_ops::kLoop)      ? run_loop(run)
                                                                                 : run_scan(run);
  check_outputs(result, n.outputs.size(), "body");
  return result;
}

}  // namespace sparsebit
