// `sparsebit inspect`: a model's inputs, outputs, ops and quantization, and drawings of it.

#include <spdlog/fmt/fmt.h>

#include <cstdio>
#include <iostream>
#include <functional>
#include <map>
#include <optional>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/graph_dump.h"
#include "sparsebit/core/saturation.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/log.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

/// Draws the float model, or with a config the converted one with its quantizers.
void write_drawings(const sb::Model& model, const sb::Session& session, bool configured, const std::string& dot,
                    const std::string& mermaid) {
  if (dot.empty() && mermaid.empty()) return;
  std::optional<sb::AtomicFile> dot_out, mermaid_out;  // claimed first: a bad path fails before work
  if (!dot.empty()) dot_out.emplace(dot);
  if (!mermaid.empty()) mermaid_out.emplace(mermaid);
  std::optional<sb::QuantModel> qm;
  std::map<std::string, sb::NodeNote> notes;
  if (configured) {
    qm.emplace(session.quant_model(sb::Model{model.graph.clone(), model.meta}));
    notes = sb::quant_notes(*qm);
  }
  const sb::Graph& g = qm ? qm->graph() : model.graph;
  if (dot_out) {
    dot_out->write(sb::graph_to_dot(g, notes));
    dot_out->commit();
    sparsebit::sdk::log_info(fmt::format("wrote {}", sb::displayed(dot)));
  }
  if (mermaid_out) {
    mermaid_out->write(sb::graph_to_mermaid(g, notes));
    mermaid_out->commit();
    sparsebit::sdk::log_info(fmt::format("wrote {}", sb::displayed(mermaid)));
  }
}

/// Every node (subgraphs' too) with its op and the torch module it was exported from.
json node_list(const sb::Graph& g) {
  json list = json::array();
  std::function<void(const sb::Graph&)> add = [&](const sb::Graph& graph) {
    for (const auto* n : graph.nodes()) {
      list.push_back({{"name", n->name},
                      {"op", (n->domain.empty() ? "" : n->domain + ":") + n->op_type},
                      {"module", sb::module_path_of(n->name)}});
      for (const sb::Graph* sub : n->subgraphs()) add(*sub);
    }
  };
  add(g);
  return list;
}

int cmd_inspect(const std::string& model_path, const std::string& config_path, bool as_json, bool list_nodes,
                const std::string& dot, const std::string& mermaid) {
  std::vector<PathRole> drawings;
  if (!dot.empty()) drawings.push_back({"--dot", dot});
  if (!mermaid.empty()) drawings.push_back({"--mermaid", mermaid});
  check_distinct_paths({{"the model", model_path}, {"-c", config_path}}, drawings);  // drawings never touch the model
  const sb::Session session(config_path.empty() ? sb::Config() : sb::Config::from_file(config_path));
  const sb::Registry& registry = session.registry();
  sb::Model model = session.read(model_path);
  write_drawings(model, session, !config_path.empty(), dot, mermaid);
  std::map<std::string, std::pair<int, std::string>> histogram;            // op -> (count, plugin)
  std::function<void(const sb::Graph&)> count = [&](const sb::Graph& g) {  // subgraphs' nodes count too
    for (const auto* n : g.nodes()) {
      std::string op = (n->domain.empty() ? "" : n->domain + ":") + n->op_type;
      auto& h = histogram[op];
      ++h.first;
      const auto* e = registry.op(n->op_type, n->domain);
      h.second = sb::is_control_flow(*n) ? "core (control flow)" : e ? e->plugin : "";
      for (const sb::Graph* sub : n->subgraphs()) count(*sub);
    }
  };
  count(model.graph);
  // Bit widths below 8 recorded by our exporter (Note [Narrow export]).
  json narrow = json::object();
  if (auto it = model.meta.metadata_props.find("sparsebit.bits"); it != model.meta.metadata_props.end()) {
    try {
      narrow = json::parse(it->second);
    } catch (const std::exception&) {
      sparsebit::sdk::log_warn(fmt::format("{}: metadata sparsebit.bits is not valid JSON; ignored", model_path));
    }
  }
  const std::size_t qdq = sb::count_qdq_nodes(model.graph);
  const sb::SaturationCheck saturation =
      sb::check_u8s8_saturation(model.graph, sb::OpTraitTable(registry));  // Note [u8s8 saturation]
  if (as_json) {
    json j;
    j["model"] = model_path;
    j["opset"] = model.graph.default_opset();
    json risks = json::array();
    for (const auto& r : saturation.at_risk)
      risks.push_back({{"node", r.node},
                       {"op", r.op_type},
                       {"weight", r.weight},
                       {"pairs", r.pairs},
                       {"pairs_over", r.pairs_over},
                       {"worst_pair", r.worst_pair}});
    j["quantization"] = {{"qdq_nodes", qdq},
                         {"narrow_bits", narrow},
                         {"u8s8_saturation", {{"layers_checked", saturation.layers_checked}, {"at_risk", risks}}}};
    j["nodes"] = model.graph.num_nodes();
    j["initializers"] = model.graph.initializers.size();
    j["inputs"] = json::array();
    for (const auto& v : model.graph.inputs) j["inputs"].push_back(value_info_json(v));
    j["outputs"] = json::array();
    for (const auto& v : model.graph.outputs) j["outputs"].push_back(value_info_json(v));
    json ops = json::array();
    for (const auto& [op, h] : histogram)
      ops.push_back({{"op", op}, {"count", h.first}, {"qmodule", !h.second.empty()}, {"plugin", h.second}});
    j["ops"] = ops;
    j["node_list"] = node_list(model.graph);
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::cout << sb::displayed(model_path) << ": opset " << model.graph.default_opset() << ", " << model.graph.num_nodes()
            << " nodes, " << model.graph.initializers.size() << " initializers\n";
  for (const auto& v : model.graph.inputs)
    std::cout << "  input  " << v.name << ": " << sb::onnx_type_name(v.elem_type) << " " << dims_text(v) << "\n";
  for (const auto& v : model.graph.outputs)
    std::cout << "  output " << v.name << ": " << sb::onnx_type_name(v.elem_type) << " " << dims_text(v) << "\n";
  std::cout << "\n  count  op                          QModule\n";
  int missing = 0;
  for (const auto& [op, h] : histogram) {
    std::printf("  %5d  %-26s  %s\n", h.first, op.c_str(), h.second.empty() ? "MISSING" : h.second.c_str());
    missing += h.second.empty();
  }
  if (missing)
    std::cout << "\n" << missing << " op type(s) have no QModule; `sparsebit plugins` lists what is loaded\n";
  if (list_nodes) {
    std::cout << "\n  node (op) <- torch module, which skip and [[specific]] globs match as well\n";
    for (const auto& n : node_list(model.graph)) {
      const std::string module = n["module"];
      std::cout << "  " << sb::displayed(n["name"].get<std::string>()) << " ("
                << sb::displayed(n["op"].get<std::string>()) << ")"
                << (module.empty() ? "" : " <- " + sb::displayed(module)) << "\n";
    }
  }
  if (qdq) {
    std::cout << "\n  " << qdq << " QuantizeLinear/DequantizeLinear nodes";
    if (!narrow.empty()) std::cout << "; tensors quantized below 8 bits (sparsebit.bits):";
    std::cout << "\n";
    for (const auto& [tensor, bits] : narrow.items()) std::cout << "    " << tensor << ": " << bits << " bits\n";
    if (saturation.layers_checked > 0) {
      std::cout << "  u8 x s8 pair saturation (x86 without VNNI): " << saturation.at_risk.size() << " of "
                << saturation.layers_checked << " integer layers at risk\n";
      for (const auto& r : saturation.at_risk)
        std::cout << "    " << r.node << " (" << r.op_type << "): " << r.pairs_over << " of " << r.pairs
                  << " weight pairs over, worst |w_i| + |w_j| = " << r.worst_pair << "\n";
    }
  }
  return 0;
}

}  // namespace

Command add_inspect(CLI::App& app) {
  struct Args {
    std::string model, config, dot, mermaid;
    bool json = false, nodes = false;
  };
  auto a = std::make_shared<Args>();
  auto* inspect = app.add_subcommand("inspect", "Show a model's inputs, outputs and ops, and which ops have a QModule");
  inspect->add_option("model", a->model, "ONNX model")->required();
  inspect->add_option("-c,--config", a->config,
                      "Config whose [plugins] section to use; with --dot/--mermaid, draw the converted model");
  inspect->add_flag("--json", a->json, "Machine-readable output (node_list: every node, its op and torch module)");
  inspect->add_flag("--nodes", a->nodes, "List every node with its op and the torch module it came from");
  inspect->add_option("--dot", a->dot, "Write a Graphviz drawing of the model (quantizers marked with -c)");
  inspect->add_option("--mermaid", a->mermaid, "Write a Mermaid flowchart of the model (quantizers marked with -c)");
  return {inspect, [a] { return cmd_inspect(a->model, a->config, a->json, a->nodes, a->dot, a->mermaid); }};
}

}  // namespace sparsebit::cli
