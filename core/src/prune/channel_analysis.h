#pragma once
// Channel analysis for channel removal (Note [Channel removal]): which channels of which tensors
// must go together, and every constant and count that reads them (channel_analysis.cpp).

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "prune/prune_internal.h"
#include "sparsebit/sdk/op_traits.h"

namespace sparsebit::prune_detail {

struct UnionFind {
  std::vector<int> parent;
  int make() {
    parent.push_back(static_cast<int>(parent.size()));
    return parent.back();
  }
  int find(int a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
  }
  void unite(int a, int b) { parent[find(a)] = find(b); }
};

/// Which atom sits at each position of a tensor's channel axis.
struct Track {
  std::int64_t axis = 0;
  std::vector<int> atoms;
};

/// A constant input sliced along `axis` when channels go. Producer and consumer weights are
/// zeroed in the masked model; parameters (BatchNormalization, depthwise) are not.
struct Site {
  enum Kind { kProducer, kConsumer, kParam } kind;
  std::size_t node, input;
  std::int64_t axis;
  std::vector<int> atoms;
};

/// An integer that must become the number of kept positions: a depthwise Conv's `group`
/// (input = -1) or one entry of a Reshape's constant shape.
struct CountSite {
  std::size_t node;
  int input;  ///< -1: the `group` attribute
  std::size_t position;
  std::vector<int> atoms;
};

struct Producer {
  std::size_t node;
  std::vector<int> atoms;
  double ratio = 0;
  bool skipped = false;
};

class ChannelAnalysis {
 public:
  /// Ops other than the producers (Conv, Gemm, MatMul), the elementwise ones, Concat and
  /// Flatten/Reshape say through their ChannelFlow trait in `registry` how channels pass.
  ChannelAnalysis(const Graph& g, const Shapes& shapes, const Registry& registry)
      : g_(g), shapes_(shapes), registry_(registry) {}

  UnionFind uf;
  std::vector<bool> pinned;           // by atom
  std::map<int, std::string> reason;  // pinned atom -> the node that pinned it
  std::vector<Site> sites;
  std::vector<CountSite> counts;
  std::vector<Producer> producers;
  std::vector<int> atom_producer;          // atom -> index into producers, -1 for pinned fillers
  std::vector<std::int64_t> atom_channel;  // atom -> output channel of its producer

  /// `prunable(node)` says whether a producer's channels may go (else they are pinned).
  void run(const std::function<std::pair<bool, double>(const Node&)>& prunable);

 private:
  const Graph& g_;
  const Shapes& shapes_;
  const Registry& registry_;
  std::map<std::string, Track> tracks_;
  const Node* current_ = nullptr;

  Track* tracked(const std::string& v);
  const Shape* shape(const std::string& v) const;
  const at::Tensor* initializer(const std::string& v) const;
  void pin(const Track& t);
  void pin_inputs(const Node& n);
  int new_atom(int producer, std::int64_t channel, bool pin_it);
  void set_output(const Node& n, std::size_t k, Track t);
  /// Slices constant input `input` of node `i` along `axis` with `atoms`, or pins them when
  /// the input is not an initializer of that extent. A constant read by several nodes (exporters
  /// store identical tensors once) is copied for each reader that slices it.
  bool param(std::size_t i, const Node& n, std::size_t input, std::int64_t axis, const std::vector<int>& atoms,
             Site::Kind kind = Site::kParam) {
    if (!n.has_input(input)) return true;
    const at::Tensor* c = initializer(n.inputs[input]);
    if (!c || axis >= c->dim() || c->size(axis) != static_cast<std::int64_t>(atoms.size())) return false;
    if (g_.is_graph_output(n.inputs[input])) return false;
    sites.push_back({kind, i, input, axis, atoms});
    return true;
  }
  std::int64_t attr_axis(const Node& n, const char* key, std::int64_t fallback, std::int64_t rank) const;
  void new_producer(std::size_t i, const Node& n, std::int64_t channels, Track& out,
                    const std::function<std::pair<bool, double>(const Node&)>& prunable) {
    auto [ok, ratio] = prunable(n);
    const int p = static_cast<int>(producers.size());
    producers.push_back({i, {}, ratio, !ok});
    for (std::int64_t c = 0; c < channels; ++c) producers.back().atoms.push_back(new_atom(p, c, !ok));
    out.atoms = producers.back().atoms;
  }

  void visit(std::size_t i, const Node& n, const std::function<std::pair<bool, double>(const Node&)>& prunable);

  /// A WeightedLayer with a constant weight: a consumer of the channels reaching it, a producer
  /// of its own output channels, or (depthwise) a node they pass through.
  void layer(std::size_t i, const Node& n, const WeightedLayer& layer,
             const std::function<std::pair<bool, double>(const Node&)>& prunable);
  /// An op with one tracked input (`input`), through its ChannelFlow trait; pinned without one.
  void follow(std::size_t i, const Node& n, std::size_t input, const Track& x);

  void broadcast(std::size_t i, const Node& n);

  void concat(const Node& n);

  /// Flatten, or a Reshape that merges the channel axis with the axes after it (into features)
  /// or only reshapes the axes after it.
  void flatten(std::size_t i, const Node& n, const Track& x);
};

}  // namespace sparsebit::prune_detail
