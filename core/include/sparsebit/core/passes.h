#pragma once
/// \file
/// The schedule of passes and running them from the registry: the pipeline's stages (QuantModel
/// calls them), `sparsebit simplify`, and tests.

#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/pass.h"

namespace sparsebit {

/// Note [Pass schedule]
/// A pass's plugin registers its name with the Pass (whose stage() says where in the pipeline it
/// runs) and, optionally, its place in the default schedule (PassSchedule: an order and whether
/// it is on by default, for every backend or some). The schedule of a run is every registered
/// pass, those with a place first by (order, name), then the others by name, off unless the
/// config turns them on. A config's `[schedule]` switches, `[passes] order`, `[passes] extra`
/// and `[passes.<name>]` options are checked against the registry here, not when the file is
/// read: a vendor's pass is configured exactly as a shipped one, a misspelt name is refused with
/// the nearest registered one, and a plugin the config disables takes its default passes with it
/// (a note says so). `bn_tuning` is a step of the pipeline itself (bn_tuning.h), switched in
/// [schedule] like a pass and never in the list returned.

/// One pass of a run's schedule, in the order they run.
struct ScheduleEntry {
  std::string pass;
  bool enabled;
  Options options{"[passes]"};  ///< from [passes.<name>]
};

/// The schedule `config` gives over the passes `registry` holds (Note [Pass schedule]). Throws,
/// naming the config and the key, for a name no loaded plugin registers.
SPARSEBIT_API std::vector<ScheduleEntry> resolve_schedule(const Config& config, const Registry& registry);

/// Calibration samples for simplify passes that measure activations (PassContext::channel_absmax,
/// channel_moments) and the weight grids of the config (PassContext::weight_grid).
struct PassData {
  std::function<std::unique_ptr<Dataset>()> open;  ///< opens the samples afresh; empty: none
  int batch_size = 32;
  int count = 0;  ///< samples read (0: all)
  /// PassContext::weight_grid; empty without a quantization config.
  std::function<std::optional<PassContext::WeightGrid>(const Node&, std::size_t, std::int64_t)> weight_grid;
  /// Where the float model runs for those statistics (a copy of its weights goes there for each
  /// pass over the data); ChannelMoments come back on it, channel_absmax on the host.
  std::string device = "cpu";
};

/// Runs, in schedule order, every enabled pass whose stage is `stage`: simplify passes on
/// `graph` (validated after each), fuse passes on `state`. Errors name the pass and its plugin;
/// `config_source` names the config in messages about missing passes and unread options.
/// Returns whether any pass changed something.
/// Simplify passes get calibration statistics from `data` where it can open samples.
SPARSEBIT_API bool run_passes(const std::vector<ScheduleEntry>& schedule, Pass::Stage stage, Graph& graph,
                              const Registry& registry, QuantState* state, const std::string& config_source,
                              const PassData& data = {});

/// A kLayer-stage pass made for one calibration run (the layerwise runner calls it per node).
struct LayerPass {
  std::string name, plugin;
  Options options;
  std::unique_ptr<Pass> pass;
};

/// Makes every enabled pass of the schedule whose stage is kLayer, in schedule order.
SPARSEBIT_API std::vector<LayerPass> make_layer_passes(const std::vector<ScheduleEntry>& schedule,
                                                       const Registry& registry);

/// Runs one simplify-stage pass by name with default options; returns whether it changed the graph.
SPARSEBIT_API bool run_simplify_pass(const std::string& name, Graph& graph, const Registry& registry);

}  // namespace sparsebit
