#include "sparsebit/core/passes.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/op.h"

namespace sparsebit {

bool run_passes(const std::vector<ScheduleEntry>& schedule, Pass::Stage stage, Graph& graph, const Registry& registry,
                QuantState* state, const std::string& config_source) {
  bool any = false;
  for (const auto& entry : schedule) {
    if (!entry.enabled || entry.pass == "bn_tuning") continue;  // bn_tuning is a host step (bn_tuning.h)
    const auto* p = registry.pass(entry.pass);
    if (!p) {
      throw Error(config_source + ": [schedule] " + entry.pass + " is on, but no loaded plugin provides pass '" +
                  entry.pass + "' (set it to false or install the plugin; `sparsebit plugins` lists passes)");
    }
    PassContext ctx{entry.options};
    ctx.evaluate = [&registry, &graph](const Node& n, const std::vector<at::Tensor>& inputs) {
      const auto* op = registry.op(n.op_type, n.domain);
      if (!op) throw Error("no QModule for op " + n.op_type);
      auto it = graph.opset_imports.find(n.domain);
      auto module = op->factory(OpContext{n, it == graph.opset_imports.end() ? 0 : it->second, graph});
      c10::InferenceMode guard;
      try {
        return module->forward(inputs);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        throw Error(n.describe() + ": " + e.what());
      }
    };
    try {
      auto pass = p->factory();
      if (pass->stage() != stage) continue;
      const bool changed = stage == Pass::Stage::kFuse ? pass->run_quant(*state, ctx) : pass->run(graph, ctx);
      if (changed) sdk::log_debug("pass '" + entry.pass + "' changed the model");
      any = any || changed;
      if (stage == Pass::Stage::kSimplify) graph.validate();
      auto unused = entry.options.unused();
      if (!unused.empty()) {
        throw Error(config_source + ": [passes." + entry.pass + "] key " + unused.front() +
                    " is not read by this pass");
      }
    } catch (const Error& e) {
      throw Error("pass '" + entry.pass + "' (plugin '" + p->plugin + "'): " + e.what());
    } catch (const std::exception& e) {
      throw Error("pass '" + entry.pass + "' (plugin '" + p->plugin + "') failed: " + e.what());
    }
  }
  return any;
}

std::vector<LayerPass> make_layer_passes(const std::vector<ScheduleEntry>& schedule, const Registry& registry) {
  std::vector<LayerPass> made;
  for (const auto& entry : schedule) {
    if (!entry.enabled || entry.pass == "bn_tuning") continue;
    const auto* p = registry.pass(entry.pass);
    if (!p) continue;  // reported by run_passes, which runs first
    std::unique_ptr<Pass> pass;
    try {
      pass = p->factory();
    } catch (const std::exception& e) {
      throw Error("pass '" + entry.pass + "' (plugin '" + p->plugin + "') failed to construct: " + e.what());
    }
    if (pass->stage() != Pass::Stage::kLayer) continue;
    made.push_back({entry.pass, p->plugin, entry.options, std::move(pass)});
  }
  return made;
}

bool run_simplify_pass(const std::string& name, Graph& graph, const Registry& registry) {
  return run_passes({{name, true}}, Pass::Stage::kSimplify, graph, registry, nullptr, "run_simplify_pass");
}

}  // namespace sparsebit
