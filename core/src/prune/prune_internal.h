#pragma once
// What the pruning files share (sparsebit/core/prune.h is the public side):
//   prune.cpp          prune() and fine-tuning, and the helpers below
//   prune_channels.cpp channel analysis and channel removal (Note [Channel removal])
//   prune_masks.cpp    element and N:M masks, bias compensation (Note [Bias compensation])
//   prune_stats.cpp    sample inputs, model statistics, the JSON report

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/prune.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/sparser.h"

namespace sparsebit::prune_detail {

using Shape = std::vector<std::int64_t>;
using Shapes = std::map<std::string, Shape>;

/// Product of s[from:], 1 when empty.
inline std::int64_t product(const Shape& s, std::size_t from = 0) {
  return from >= s.size() ? 1
                          : std::accumulate(s.begin() + static_cast<std::ptrdiff_t>(from), s.end(), std::int64_t{1},
                                            std::multiplies<std::int64_t>());
}

/// Runs `graph` on `sample` and records the shape of every tensor a node reads and of the outputs.
Shapes run_shapes(const Graph& graph, const Registry& registry, const std::vector<at::Tensor>& sample,
                  std::vector<at::Tensor>* outputs = nullptr);

std::string pattern_name(SparsityPattern p);

/// Ratio for a node: the first matching [[sparse.specific]], else [sparse] ratio.
double ratio_for(const SparseConfig& s, const std::string& node);

at::Tensor checked_scores(Sparser& sparser, const std::string& name, const at::Tensor& w, std::int64_t channel_axis,
                          const Node& n, SparsityPattern pattern);

void add_layer(PruneResult& r, const Node& n, const std::string& weight, const at::Tensor& before,
               const at::Tensor& after);

/// Writes `value` for input `input` of node `node`: in place when nobody else reads the
/// initializer, else under a new name.
void set_input_constant(Graph& g, std::size_t node, std::size_t input, at::Tensor value,
                        const std::map<std::string, int>& readers);

std::map<std::string, int> initializer_readers(const Graph& g);

/// `graph` with the readers of Identity(initializer) reading the initializer itself: exporters
/// share identical weights and biases between layers that way, and pruning then slices or
/// rewrites them as any other (a shared one under a new name, set_input_constant).
Graph reading_initializers_directly(const Graph& graph);

// Bias compensation (prune_masks.cpp)

/// The activation mean of each layer in `nodes` over `data`, as its WeightedLayer gathers it
/// (activation_sums); layers that gather none are left out.
std::map<std::size_t, at::Tensor> activation_means(const Graph& g, const Registry& registry, Dataset& data,
                                                   const Config& config, const std::set<std::size_t>& nodes);

/// What node `n`'s bias must gain to keep its output's mean when its weight changes from `w`
/// to `w_new` (WeightedLayer::bias_shift); undefined where a bias cannot express it or where
/// the bias is computed, not a constant of `g`.
at::Tensor bias_shift(const Graph& g, const Registry& registry, const Node& n, const at::Tensor& w,
                      const at::Tensor& w_new, const at::Tensor& mean);

/// Adds `delta` (one value per output channel) to node `node`'s bias input, creating it if absent.
void add_to_bias(Graph& g, const Registry& registry, std::size_t node, const at::Tensor& delta,
                 const std::map<std::string, int>& readers);

// The two ways to prune

void prune_channels(const Model& model, const Config& config, Sparser& sparser, const Registry& registry,
                    const std::vector<at::Tensor>& sample, Dataset* data, PruneResult& r);

void prune_elements(const Model& model, const Config& config, Sparser& sparser, const Registry& registry, Dataset* data,
                    PruneResult& r);

}  // namespace sparsebit::prune_detail
