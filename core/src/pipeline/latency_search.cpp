// The latency search (Note [Latency search]): which quantized regions run faster left float.
//
// Note [Latency search]
// A static placement (Note [ONNX Runtime placement]) estimates what Q/DQ cost against what the
// integer kernels save; the processor decides. After calibration (and the accuracy target),
// `quantize` times candidates as TensorRT Model Optimizer's autotune does. The quantized layers
// of the main graph fall into regions: each quantized node is joined to the producer of every
// quantized tensor it reads (past a Relu or another op of one input and no quantizer, which the
// Q makes redundant) where that producer computes on integers (every variable input quantized,
// and weights or two such inputs), since its integer kernel needs the Q the reader's quantizer
// makes. Switching a whole region off thus leaves no integer layer without its Q and no Q
// without its reader, whatever the other regions do. Up to `[latency] regions` regions, those
// with the fewest weights first (where Q/DQ weigh most against the integer work), are each
// timed left float, all in one ONNX Runtime process with the float model and the export as
// placed, round-robin, `runs` rounds per thread count. A region goes float where it ran faster
// so in at least 3/4 of the rounds and by more than 1% (medians) at some thread count, and not
// slower by its median at any: a region that noise cannot tell apart stays as placed. The
// regions chosen are then timed together against the export as placed and kept float only if
// that holds again (one at a time is not all at once). A model whose every region runs faster in
// float keeps its placement: quantizing cannot speed it up, and the latency step says so. With
// an accuracy target the target runs first; the report's `kept_float` names what kept each
// float layer float ("accuracy" or "latency").

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "base/log.h"
#include "pipeline/ort_timer.h"
#include "pipeline/pipeline_steps.h"
#include "quant/quant_model_access.h"
#include "sparsebit/core/pipeline.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/quant_slots.h"

namespace sparsebit::steps {

namespace {
// Note [Latency search]: a region goes float where it ran faster so in at least this share of
// the rounds and by more than this margin at some thread count, and slower at none.
constexpr double kDecisiveShare = 0.75;
constexpr double kMargin = 0.01;
constexpr std::int64_t kSearchRuns = 8;
}  // namespace

std::vector<std::vector<std::size_t>> quantized_regions(const QuantModel& qm) {
  const Graph& g = qm.graph();
  const std::size_t count = g.num_nodes();
  const QuantSlots& slots = QuantModelAccess::slots(qm);
  std::vector<bool> active(count, false), weighted(count, false);
  std::vector<std::size_t> activations(count, 0);
  for (const QuantSlot& s : slots.all()) {
    if (s.node_index >= count || !slots.usable(s)) continue;
    active[s.node_index] = true;
    if (s.role == InputRole::kWeight) weighted[s.node_index] = true;
    if (!g.initializers.count(s.tensor)) ++activations[s.node_index];
  }
  std::map<std::string, std::size_t> producer;
  for (std::size_t i = 0; i < count; ++i)
    for (const auto& o : g.node(i).outputs)
      if (!o.empty()) producer[o] = i;
  auto variable_inputs = [&](const Node& n) {
    std::vector<std::string> out;
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (n.has_input(k) && !g.initializers.count(n.inputs[k])) out.push_back(n.inputs[k]);
    return out;
  };
  // A layer that computes on integers: every variable input quantized, and weights or several
  // quantized inputs (an op of one input, a Tanh or a MaxPool, runs as well in float).
  auto computes = [&](std::size_t i) {
    if (!active[i] || (!weighted[i] && activations[i] < 2)) return false;
    return activations[i] >= variable_inputs(g.node(i)).size();
  };
  std::vector<std::size_t> root(count);
  for (std::size_t i = 0; i < count; ++i) root[i] = i;
  auto find = [&](std::size_t i) {
    while (root[i] != i) i = root[i] = root[root[i]];
    return i;
  };
  for (const QuantSlot& s : slots.all()) {
    if (s.node_index >= count || !slots.usable(s) || g.initializers.count(s.tensor)) continue;
    // The producer, past ops of one variable input and no quantizer (a Relu its Q makes redundant).
    auto p = producer.find(s.tensor);
    for (int hops = 0; hops < 4 && p != producer.end() && !active[p->second]; ++hops) {
      const auto in = variable_inputs(g.node(p->second));
      if (in.size() != 1) break;
      p = producer.find(in[0]);
    }
    if (p != producer.end() && computes(p->second)) root[find(s.node_index)] = find(p->second);
  }
  std::map<std::size_t, std::vector<std::size_t>> by_root;
  for (std::size_t i = 0; i < count; ++i)
    if (active[i]) by_root[find(i)].push_back(i);
  std::vector<std::vector<std::size_t>> regions;
  for (auto& [r, nodes] : by_root) regions.push_back(std::move(nodes));
  std::sort(regions.begin(), regions.end());
  return regions;
}

/// Whether model `k` ran faster than the second (the export as placed): in at least 3/4 of the
/// rounds and by more than the margin at some thread count, and not slower by its median at any.
bool runs_faster(const std::vector<ThreadTimes>& times, std::size_t k, std::int64_t runs) {
  const auto decisive = static_cast<std::int64_t>(std::ceil(kDecisiveShare * static_cast<double>(runs)));
  bool faster = false, slower = false;
  for (const ThreadTimes& t : times) {
    const double speedup = t.ms[1] / t.ms[k];
    faster = faster || (t.beats_second[k] >= decisive && speedup > 1 + kMargin);
    slower = slower || speedup < 1 - kMargin;
  }
  return faster && !slower;
}

LatencySearch search_latency(QuantModel& qm, const Config& config, const std::string& float_model,
                             const DataSource& calib) {
  const auto start = std::chrono::steady_clock::now();
  const LatencyConfig& lc = config.latency;
  LatencySearch r;
  r.runs = lc.runs;
  const std::vector<std::vector<std::size_t>> regions = quantized_regions(qm);
  r.regions = regions.size();
  const Runtime runtime = find_timer(lc);
  if (regions.size() < 2) {
    r.why_not = regions.empty() ? "no layer of the main graph is quantized; control-flow bodies are not searched"
                                : "the quantized layers form one region";
  } else if (lc.runs < kSearchRuns) {
    r.why_not = "[latency] runs = " + std::to_string(lc.runs) + ": fewer than " + std::to_string(kSearchRuns) +
                " rounds cannot tell a region's time from noise";
  } else if (!runtime.why_not.empty()) {
    r.why_not = runtime.why_not;
  }
  if (!r.why_not.empty()) return r;

  const Graph& g = qm.graph();
  // The regions with the least weight first: where Q/DQ weigh most against the integer work.
  std::vector<std::pair<std::int64_t, std::size_t>> order;
  for (std::size_t k = 0; k < regions.size(); ++k) {
    std::int64_t weight = 0;
    for (const QuantSlot& s : qm.slots())
      if (s.role == InputRole::kWeight && g.initializers.count(s.tensor) &&
          std::binary_search(regions[k].begin(), regions[k].end(), s.node_index))
        weight += g.initializers.at(s.tensor).numel();
    order.emplace_back(weight, k);
  }
  std::stable_sort(order.begin(), order.end());
  order.resize(std::min<std::size_t>(order.size(), static_cast<std::size_t>(lc.regions)));

  // The slots each region switches off as float (those in use now).
  auto region_slots = [&](std::size_t k) {
    std::vector<std::size_t> out;
    const auto& all = qm.slots();
    for (std::size_t i = 0; i < all.size(); ++i)
      if (all[i].enabled && std::binary_search(regions[k].begin(), regions[k].end(), all[i].node_index))
        out.push_back(i);
    return out;
  };
  auto set = [&](const std::vector<std::size_t>& which, bool on) {
    for (std::size_t i : which) qm.set_slot_enabled(i, on);
  };
  Scratch scratch;
  std::vector<std::string> models = {float_model};
  {
    QuietLogs quiet;
    std::string external;
    models.push_back(scratch.write("export.onnx", qm.serialize(&external)));
    if (!external.empty()) {
      r.why_not = "the export keeps its weights in an external file";
      return r;
    }
    for (const auto& [weight, k] : order) {
      const auto off = region_slots(k);
      set(off, false);
      try {
        models.push_back(scratch.write("region" + std::to_string(k) + ".onnx", qm.serialize()));
      } catch (...) {
        set(off, true);
        throw;
      }
      set(off, true);
    }
  }
  logs::info("latency search: timing {} of {} quantized regions as float in ONNX Runtime", order.size(),
             regions.size());
  std::string failure;
  const std::vector<ThreadTimes> times = time_models(lc, runtime, models, g, calib, failure);
  if (times.empty()) {
    r.why_not = "ONNX Runtime could not time the models (" + failure + ")";
    return r;
  }
  r.ran = true;
  for (const ThreadTimes& t : times) r.threads.push_back(t.threads);
  std::vector<std::size_t> chosen;
  for (std::size_t c = 0; c < order.size(); ++c) {
    LatencySearch::Region region;
    for (std::size_t n : regions[order[c].second]) region.nodes.push_back(g.node(n).name);
    for (const ThreadTimes& t : times) {
      region.speedup_as_float.push_back(t.ms[1] / t.ms[c + 2]);
      region.rounds_faster_as_float.push_back(t.beats_second[c + 2]);
    }
    region.made_float = runs_faster(times, c + 2, lc.runs);
    if (region.made_float) chosen.push_back(c);
    r.timed.push_back(std::move(region));
  }
  // A model of which every region runs faster in float is one quantizing cannot speed up: it
  // keeps its static placement, and the latency step says what the export gains instead.
  if (chosen.size() == regions.size()) chosen.clear();
  std::vector<std::size_t> switched;  // the slots the chosen regions switch off
  for (std::size_t c : chosen) {
    const auto off = region_slots(order[c].second);
    switched.insert(switched.end(), off.begin(), off.end());
  }
  set(switched, false);
  if (!chosen.empty()) {
    // The regions were timed one at a time: the choice stands only if, all together, it runs faster.
    std::vector<std::string> both = {float_model, models[1]};
    {
      QuietLogs quiet;
      both.push_back(scratch.write("chosen.onnx", qm.serialize()));
    }
    const std::vector<ThreadTimes> check = time_models(lc, runtime, both, g, calib, failure);
    for (const ThreadTimes& t : check) r.speedup_together.push_back(t.ms[1] / t.ms[2]);
    if (check.empty() || !runs_faster(check, 2, lc.runs)) {
      set(switched, true);
      chosen.clear();
      r.reverted = true;
    }
  }
  for (auto& region : r.timed) region.made_float = region.made_float && !chosen.empty();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

void log_latency_search(const LatencySearch& r) {
  if (!r.ran) {
    logs::info("latency search: not run ({})", r.why_not);
    return;
  }
  std::size_t made = 0;
  for (const auto& region : r.timed) {
    if (!region.made_float) continue;
    ++made;
    std::string speed;
    for (std::size_t t = 0; t < region.speedup_as_float.size(); ++t)
      speed += (speed.empty() ? "" : ", ") + fmt::format("{:.3f}x at {} thread{}", region.speedup_as_float[t],
                                                         r.threads[t], r.threads[t] == 1 ? "" : "s");
    logs::info("latency search: {} node{} from '{}' left float, faster so in ONNX Runtime ({})", region.nodes.size(),
               region.nodes.size() == 1 ? "" : "s", region.nodes.front(), speed);
  }
  if (r.reverted)
    logs::info(
        "latency search: the regions that ran faster as float one at a time did not together; all stay "
        "quantized");
  logs::info("latency search: {} of {} quantized regions timed as float in {:.1f} s, {} left float", r.timed.size(),
             r.regions, r.seconds, made);
}

}  // namespace sparsebit::steps
