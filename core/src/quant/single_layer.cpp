#include "quant/single_layer.h"

#include <map>
#include <string>

#include "quant/quant_model_access.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/quant_slots.h"

namespace sparsebit::detail {

void single_layer_outputs(QuantModel& qm, const std::vector<std::vector<at::Tensor>>& samples,
                          const std::vector<std::size_t>& layers,
                          const std::function<void(std::size_t, std::size_t, const std::vector<at::Tensor>&)>& sink,
                          const std::function<void(std::size_t)>& sample_done) {
  const Graph& g = qm.graph();
  const auto nodes = g.nodes();
  Executor& ex = qm.executor();
  QuantSlots& qs = QuantModelAccess::slots(qm);
  for (std::size_t x = 0; x < samples.size(); ++x) {
    std::map<std::string, at::Tensor> values;  // this sample's float values
    for (std::size_t i = 0; i < g.inputs.size(); ++i) values[g.inputs[i].name] = samples[x].at(i);
    auto inputs_of = [&](const Node& n, const std::map<std::string, at::Tensor>& changed) {
      std::vector<at::Tensor> in(n.inputs.size());
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        const std::string& name = n.inputs[k];
        if (name.empty()) continue;
        if (auto c = ex.constants().find(name); c != ex.constants().end()) in[k] = c->second;
        else if (auto v = changed.find(name); v != changed.end()) in[k] = v->second;
        else in[k] = values.at(name);
      }
      return in;
    };
    const std::map<std::string, at::Tensor> none;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      auto out = ex.run_node(i, inputs_of(*nodes[i], none), ex.scope_of(i, values));
      for (std::size_t k = 0; k < nodes[i]->outputs.size() && k < out.size(); ++k)
        if (!nodes[i]->outputs[k].empty()) values[nodes[i]->outputs[k]] = out[k];
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const std::size_t layer = layers[l], start = ex.enclosing_node(layer);
      Executor::InputHook in_body;
      if (layer != start)
        in_body = [&](std::size_t n, std::size_t k, const at::Tensor& v) {
          return n == layer ? qs.apply(n, k, v, /*force=*/true) : v;
        };
      std::map<std::string, at::Tensor> changed;
      for (std::size_t i = start; i < nodes.size(); ++i) {
        const Node& n = *nodes[i];
        bool touched = i == start;
        for (const auto& name : n.inputs) touched = touched || changed.count(name);
        for (const auto& name : ex.implicit_inputs(i)) touched = touched || changed.count(name);
        if (!touched) continue;
        auto in = inputs_of(n, changed);
        if (i == start && layer == start)
          for (std::size_t k = 0; k < in.size(); ++k)
            if (in[k].defined()) in[k] = qs.apply(i, k, in[k], /*force=*/true);
        auto scope = ex.scope_of(i, values);
        for (auto& [name, v] : scope)
          if (auto c = changed.find(name); c != changed.end()) v = c->second;
        auto out = ex.run_node(i, in, scope, i == start ? in_body : Executor::InputHook());
        for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k)
          if (!n.outputs[k].empty()) changed[n.outputs[k]] = out[k];
      }
      std::vector<at::Tensor> outputs;
      for (const auto& o : g.outputs) {
        auto c = changed.find(o.name);
        outputs.push_back(c != changed.end() ? c->second : values.at(o.name));
      }
      sink(l, x, outputs);
    }
    if (sample_done) sample_done(x);
  }
}

}  // namespace sparsebit::detail
