#pragma once
/// \file
/// Graph drawings: Graphviz dot and Mermaid flowcharts of a Graph, optionally annotated with the
/// quantizers of a converted model (`sparsebit inspect MODEL --dot F --mermaid F [-c CONFIG]`).

#include <map>
#include <string>
#include <vector>

#include "sparsebit/sdk/export.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

class QuantModel;

/// What a drawing says about one node beyond its name and op.
struct NodeNote {
  std::vector<std::string> lines;  ///< one per quantized input: "in0 a: 8b per-tensor-affine minmax/uniform"
  bool quantized = false;          ///< some input is quantized (and exported)
  bool fused = false;              ///< some quantizer is fused away (simulated off, not exported)
  bool disabled = false;           ///< some quantizer is switched off
};

/// Notes for every node of a converted model that has quantizers, keyed by node name.
SPARSEBIT_API std::map<std::string, NodeNote> quant_notes(const QuantModel& qm);

/// Graphviz dot: graph inputs as ellipses, nodes as boxes (quantized: filled, fused/disabled
/// marks in the label), edges labelled with tensor names; initializers are not drawn.
SPARSEBIT_API std::string graph_to_dot(const Graph& g, const std::map<std::string, NodeNote>& notes = {});
/// The same as a Mermaid flowchart (renders on GitHub and in Markdown viewers).
SPARSEBIT_API std::string graph_to_mermaid(const Graph& g, const std::map<std::string, NodeNote>& notes = {});

}  // namespace sparsebit
