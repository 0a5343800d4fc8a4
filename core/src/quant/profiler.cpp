#include "sparsebit/core/profiler.h"
#include "sparsebit/core/config.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "quant/single_layer.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace {

/// Running sums for one tensor pair (float reference f, quantized q), in double.
struct ErrorSums {
  double sse = 0, ff = 0, qq = 0, fq = 0;
  std::int64_t n = 0;
  void add(const at::Tensor& f, const at::Tensor& q) {
    if (f.sizes() != q.sizes()) throw Error("profile: a tensor changed shape between the float and quantized runs");
    at::Tensor fd = f.detach().to(at::kDouble), qd = q.detach().to(at::kDouble);
    sse += (qd - fd).pow(2).sum().item<double>();
    ff += fd.pow(2).sum().item<double>();
    qq += qd.pow(2).sum().item<double>();
    fq += (fd * qd).sum().item<double>();
    n += f.numel();
  }
  LayerError result(std::string node, std::string op, std::string tensor) const {
    LayerError e{std::move(node), std::move(op), std::move(tensor)};
    e.mse = n > 0 ? sse / static_cast<double>(n) : 0;
    e.cosine = ff > 0 && qq > 0 ? fq / std::sqrt(ff * qq) : (sse == 0 ? 1.0 : 0.0);
    e.sqnr_db = sse > 0 ? 10 * std::log10(ff / sse) : std::numeric_limits<double>::infinity();
    return e;
  }
};

double finite(double v) { return std::isfinite(v) ? v : 999.0; }  // JSON has no infinity

/// Profiling batches, kept in memory on the calibration device: every view reads the same data.
std::vector<std::vector<at::Tensor>> profiling_batches(QuantModel& qm, Dataset& data, std::int64_t count,
                                                       std::int64_t& samples) {
  const at::Device device(qm.config().calibration.device);
  Batcher batcher(data, qm.graph().inputs, qm.config().calibration.batch_size, count);
  std::vector<std::vector<at::Tensor>> batches;
  while (auto b = batcher.next()) {
    for (auto& t : b->inputs) t = t.to(device);
    samples += b->rows;
    batches.push_back(std::move(b->inputs));
  }
  if (batches.empty()) throw Error("profile: " + data.describe() + " yielded no samples");
  return batches;
}

}  // namespace

ProfileReport profile(QuantModel& qm, Dataset& data, const ProfileOptions& options) {
  c10::InferenceMode guard;
  for (const auto& s : qm.slots())
    if (s.active() && !s.calibrated) throw Error(s.where() + ": profile needs a calibrated model; calibrate first");
  const Graph& g = qm.graph();
  ProfileReport report;
  report.model = qm.meta().source_path;
  report.output = g.outputs.empty() ? "" : g.outputs[0].name;

  const auto batches = profiling_batches(qm, data, options.samples, report.samples);

  // Layers: nodes with a quantizer that is on; their first output is what the accumulated view measures.
  // Nodes by flat number: a layer may sit inside a control-flow body (Note [Flat node numbering]).
  std::vector<const Node*> nodes;
  for (std::size_t i = 0; i < qm.executor().flat_size(); ++i) nodes.push_back(&qm.executor().flat_node(i));
  std::vector<std::size_t> layers;
  std::map<std::size_t, std::vector<std::size_t>> slots_of;  // node -> its active slots
  for (std::size_t i = 0; i < qm.slots().size(); ++i) {
    const auto& s = qm.slots()[i];
    if (!s.active()) continue;
    if (slots_of[s.node_index].empty()) layers.push_back(s.node_index);
    slots_of[s.node_index].push_back(i);
  }
  std::sort(layers.begin(), layers.end());
  std::set<std::string> measured;
  for (auto l : layers) measured.insert(nodes[l]->outputs[0]);

  // Float reference: the model output and every measured tensor, per batch.
  qm.set_quant(false, false);
  std::vector<at::Tensor> ref_out;
  std::vector<std::map<std::string, at::Tensor>> ref_values(batches.size());
  for (std::size_t b = 0; b < batches.size(); ++b) {
    auto& values = ref_values[b];
    auto out = qm.forward(batches[b], [&](const std::string& name, const at::Tensor& x) {
      if (measured.count(name) && !values.count(name)) values[name] = x;
    });
    ref_out.push_back(out.at(0));
    for (std::size_t k = 0; k < g.outputs.size(); ++k)
      if (measured.count(g.outputs[k].name)) values[g.outputs[k].name] = out[k];
  }

  std::vector<bool> was_enabled;
  for (const auto& s : qm.slots()) was_enabled.push_back(s.enabled);
  auto restore = [&] {
    for (std::size_t i = 0; i < was_enabled.size(); ++i) qm.set_slot_enabled(i, was_enabled[i]);
    qm.set_quant(false, false);
  };
  try {
    qm.set_quant(true, true);
    {
      std::map<std::string, ErrorSums> sums;
      ErrorSums whole;
      for (std::size_t b = 0; b < batches.size(); ++b) {
        std::set<std::string> seen;
        auto out = qm.forward(batches[b], [&](const std::string& name, const at::Tensor& x) {
          // A branch the float run did not take has no reference.
          if (measured.count(name) && ref_values[b].count(name) && seen.insert(name).second)
            sums[name].add(ref_values[b].at(name), x);
        });
        for (std::size_t k = 0; k < g.outputs.size(); ++k)
          if (measured.count(g.outputs[k].name) && seen.insert(g.outputs[k].name).second)
            sums[g.outputs[k].name].add(ref_values[b].at(g.outputs[k].name), out[k]);
        whole.add(ref_out[b], out.at(0));
      }
      report.whole = whole.result("(all layers)", "", report.output);
      if (options.accumulated)
        for (auto l : layers)
          if (sums.count(nodes[l]->outputs[0]))
            report.accumulated.push_back(
                sums[nodes[l]->outputs[0]].result(nodes[l]->name, nodes[l]->op_type, nodes[l]->outputs[0]));
    }
    ref_values.clear();
    if (options.single) {  // Note [Single-layer runs]: from cached float values, downstream only
      std::vector<ErrorSums> sums(layers.size());
      // Progress in layers (runs go sample by sample, every layer in each).
      const auto total = static_cast<std::int64_t>(layers.size()),
                 per_layer = static_cast<std::int64_t>(batches.size());
      std::int64_t runs = 0;
      detail::single_layer_outputs(qm, batches, layers,
                                   [&](std::size_t l, std::size_t b, const std::vector<at::Tensor>& out) {
                                     sums[l].add(ref_out[b], out.at(0));
                                     if (options.progress && ++runs % per_layer == 0)
                                       options.progress(runs / per_layer, total);
                                   });
      for (std::size_t l = 0; l < layers.size(); ++l)
        report.single.push_back(sums[l].result(nodes[layers[l]]->name, nodes[layers[l]]->op_type, report.output));
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return report;
}

std::string profile_json(const ProfileReport& r) {
  using nlohmann::json;
  auto rows = [](const std::vector<LayerError>& v) {
    json a = json::array();
    for (const auto& e : v)
      a.push_back({{"node", e.node},
                   {"op_type", e.op_type},
                   {"tensor", e.tensor},
                   {"mse", e.mse},
                   {"cosine", e.cosine},
                   {"sqnr_db", finite(e.sqnr_db)}});
    return a;
  };
  json j;
  j["model"] = r.model;
  j["output"] = r.output;
  j["samples"] = r.samples;
  j["all_layers_at_output"] = {{"mse", r.whole.mse}, {"cosine", r.whole.cosine}, {"sqnr_db", finite(r.whole.sqnr_db)}};
  j["accumulated"] = rows(r.accumulated);
  j["single"] = rows(r.single);
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

namespace {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : displayed(s)) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string num(double v, int precision = 4) {
  std::ostringstream os;
  if (!std::isfinite(v)) return "inf";
  os << std::setprecision(precision) << v;
  return os.str();
}

/// Horizontal bars of MSE, worst first, with SQNR and cosine beside each.
std::string bar_chart(std::vector<LayerError> rows, const std::string& title) {
  std::sort(rows.begin(), rows.end(), [](const LayerError& a, const LayerError& b) { return a.mse > b.mse; });
  const int bar_w = 420, label_w = 300, row_h = 18, top = 28;
  const double worst = rows.empty() ? 1 : std::max(rows.front().mse, 1e-30);
  std::ostringstream os;
  os << "<h2>" << html_escape(title) << "</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\""
     << label_w + bar_w + 260 << "\" height=\"" << top + row_h * static_cast<int>(rows.size()) + 10
     << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
     << "<text x=\"" << label_w << "\" y=\"16\" fill=\"#555\">MSE (longest = worst), SQNR dB, cosine</text>\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& e = rows[i];
    const int y = top + static_cast<int>(i) * row_h;
    const int w = std::max(1, static_cast<int>(bar_w * e.mse / worst));
    std::string label = e.node + " (" + e.op_type + ")";
    if (label.size() > 48) label = "..." + label.substr(label.size() - 45);
    os << "<text x=\"" << label_w - 6 << "\" y=\"" << y + 12 << "\" text-anchor=\"end\">" << html_escape(label)
       << "</text>"
       << "<rect x=\"" << label_w << "\" y=\"" << y + 2 << "\" width=\"" << w << "\" height=\"" << row_h - 4
       << "\" fill=\"" << (i < 3 ? "#d9534f" : "#4a90d9") << "\"><title>" << html_escape(e.node) << "</title></rect>"
       << "<text x=\"" << label_w + w + 6 << "\" y=\"" << y + 12 << "\">" << num(e.mse) << " | " << num(e.sqnr_db, 3)
       << " dB | " << num(e.cosine, 6) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

std::string table(const std::vector<LayerError>& rows) {
  std::ostringstream os;
  os << "<table><tr><th>#</th><th>node</th><th>op</th><th>tensor</th><th>MSE</th><th>cosine</th><th>SQNR "
        "dB</th></tr>\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& e = rows[i];
    os << "<tr><td>" << i << "</td><td>" << html_escape(e.node) << "</td><td>" << html_escape(e.op_type) << "</td><td>"
       << html_escape(e.tensor) << "</td><td>" << num(e.mse) << "</td><td>" << num(e.cosine, 6) << "</td><td>"
       << num(e.sqnr_db, 3) << "</td></tr>\n";
  }
  os << "</table>\n";
  return os.str();
}

}  // namespace

std::string profile_html(const ProfileReport& r) {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Sparsebit profile: " << html_escape(r.model)
     << "</"
        "title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:"
        "12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f0f0f0}</style></head><body>\n"
     << "<h1>Quantization error profile</h1>\n<p>Model <code>" << html_escape(r.model) << "</code>, " << r.samples
     << " samples. Every layer quantized, at output <code>" << html_escape(r.output) << "</code>: MSE "
     << num(r.whole.mse) << ", cosine " << num(r.whole.cosine, 6) << ", SQNR " << num(r.whole.sqnr_db, 3)
     << " dB.</p>\n";
  if (!r.single.empty()) {
    os << bar_chart(r.single, "One layer quantized at a time: error at the model output (sensitivity)")
       << "<details><summary>table (graph order)</summary>" << table(r.single) << "</details>\n";
  }
  if (!r.accumulated.empty()) {
    os << bar_chart(r.accumulated, "Every layer quantized: error at each layer's output (accumulated)")
       << "<details><summary>table (graph order)</summary>" << table(r.accumulated) << "</details>\n";
  }
  os << "</body></html>\n";
  return os.str();
}

}  // namespace sparsebit
