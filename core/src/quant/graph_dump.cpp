#include "sparsebit/core/graph_dump.h"
#include "sparsebit/core/config.h"

#include <set>
#include <sstream>

#include "sparsebit/core/quant_model.h"

namespace sparsebit {

std::map<std::string, NodeNote> quant_notes(const QuantModel& qm) {
  std::map<std::string, NodeNote> notes;
  for (const auto& s : qm.slots()) {
    NodeNote& n = notes[s.node_name];
    const char* role = s.role == InputRole::kWeight ? "w" : s.role == InputRole::kBias ? "bias" : "a";
    std::string line = "in" + std::to_string(s.input_index) + " " + role + ": " + std::to_string(s.spec.bits) + "b " +
                       s.spec.qscheme() + " " + s.observer_name + "/" + s.quantizer_name;
    if (s.fake_fused) line += " (fused)";
    if (!s.enabled) line += " (disabled)";
    n.lines.push_back(line);
    n.quantized = n.quantized || s.active();
    n.fused = n.fused || s.fake_fused;
    n.disabled = n.disabled || !s.enabled;
  }
  return notes;
}

namespace {

/// Drawing-independent view: ids, labels, edges.
struct Drawing {
  struct Box {
    std::string id;
    std::vector<std::string> label;
    const NodeNote* note = nullptr;
    bool input = false;
  };
  struct Edge {
    std::string from, to, tensor;
  };
  std::vector<Box> boxes;
  std::vector<Edge> edges;

  Drawing(const Graph& g, const std::map<std::string, NodeNote>& notes) {
    std::map<std::string, std::string> producer;  // tensor -> box id
    int k = 0;
    for (const auto& in : g.inputs) {
      Box b{"i" + std::to_string(k++), {in.name}, nullptr, true};
      producer[in.name] = b.id;
      boxes.push_back(b);
    }
    k = 0;
    for (const Node* n : g.nodes()) {
      Box b{"n" + std::to_string(k++), {n->name, n->op_type}, nullptr, false};
      if (auto it = notes.find(n->name); it != notes.end()) {
        b.note = &it->second;
        b.label.insert(b.label.end(), it->second.lines.begin(), it->second.lines.end());
      }
      for (const auto& in : n->inputs)
        if (auto p = producer.find(in); p != producer.end()) edges.push_back({p->second, b.id, in});
      for (const auto& out : n->outputs)
        if (!out.empty()) producer[out] = b.id;
      boxes.push_back(b);
    }
    k = 0;
    for (const auto& out : g.outputs) {
      Box b{"o" + std::to_string(k++), {out.name}, nullptr, true};
      if (auto p = producer.find(out.name); p != producer.end()) edges.push_back({p->second, b.id, out.name});
      boxes.push_back(b);
    }
  }
};

std::string escape_dot(const std::string& s) {
  std::string out;
  for (char c : displayed(s)) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// Mermaid labels are quoted; quotes and angle brackets become entity codes.
std::string escape_mermaid(const std::string& s) {
  std::string out;
  for (char c : displayed(s)) {
    if (c == '"') out += "#quot;";
    else if (c == '<') out += "#lt;";
    else if (c == '>') out += "#gt;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string graph_to_dot(const Graph& g, const std::map<std::string, NodeNote>& notes) {
  Drawing d(g, notes);
  std::ostringstream os;
  os << "digraph model {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n"
     << "  edge [fontname=\"Helvetica\", fontsize=8];\n";
  for (const auto& b : d.boxes) {
    std::string label;
    for (const auto& l : b.label) label += (label.empty() ? "" : "\\n") + escape_dot(l);
    os << "  " << b.id << " [label=\"" << label << "\"";
    if (b.input) os << ", shape=ellipse";
    if (b.note && b.note->quantized) os << ", style=filled, fillcolor=\"#cfe8ff\"";
    if (b.note && (b.note->fused || b.note->disabled)) os << ", peripheries=2";
    os << "];\n";
  }
  for (const auto& e : d.edges)
    os << "  " << e.from << " -> " << e.to << " [label=\"" << escape_dot(e.tensor) << "\"];\n";
  os << "}\n";
  return os.str();
}

std::string graph_to_mermaid(const Graph& g, const std::map<std::string, NodeNote>& notes) {
  Drawing d(g, notes);
  std::ostringstream os;
  os << "flowchart TD\n";
  for (const auto& b : d.boxes) {
    std::string label;
    for (const auto& l : b.label) label += (label.empty() ? "" : "<br/>") + escape_mermaid(l);
    os << "  " << b.id << (b.input ? "([\"" : "[\"") << label << (b.input ? "\"])" : "\"]") << "\n";
  }
  for (const auto& e : d.edges) os << "  " << e.from << " -->|\"" << escape_mermaid(e.tensor) << "\"| " << e.to << "\n";
  os << "  classDef quantized fill:#cfe8ff,stroke:#1f6fb2\n  classDef fused stroke-dasharray: 5 5\n";
  for (const auto& b : d.boxes) {
    if (b.note && b.note->quantized) os << "  class " << b.id << " quantized\n";
    if (b.note && (b.note->fused || b.note->disabled)) os << "  class " << b.id << " fused\n";
  }
  return os.str();
}

}  // namespace sparsebit
