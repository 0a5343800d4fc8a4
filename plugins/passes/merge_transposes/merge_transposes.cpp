// A complete pass written with the pattern matcher, as a template for your own
// (copy this folder, rename the pass, build it with sparsebit_add_plugin):
//
//   merge_transposes: Transpose(Transpose(x, p1), p2) is one Transpose with perm p1[p2[i]],
//   or nothing at all when that is the identity permutation.
//
// The three parts of every matcher pass:
//   1. a Pattern: nodes with the op types they accept, the pattern nodes feeding their inputs,
//      and checks on single nodes (attributes) or on the whole match (how nodes relate);
//   2. a Rewrite: edit the graph for one match, return false to leave it;
//   3. sparsebit::rewrite(): finds non-overlapping matches, applies the Rewrite to each, prunes
//      what became dead and repeats until nothing matches.
// The stage decides when the pass runs: kSimplify passes rewrite the float graph before
// quantizers exist and must keep its function; kFuse passes see the quantizers (QuantState).

#include "sparsebit/sdk/pattern.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::passes {
namespace {

class MergeTransposes final : public Pass {
 public:
  Stage stage() const override { return Stage::kSimplify; }

  bool run(Graph& graph, const PassContext&) override {
    // perm must be explicit: the default (reverse all axes) depends on the rank, which the
    // graph does not record.
    auto has_perm = [](const Node& n, const Graph&) { return n.has_attr("perm"); };
    Pattern p;
    p.node("first", {"Transpose"}, {}, Pattern::Inputs::kOrdered, has_perm);
    p.node("second", {"Transpose"}, {"first"}, Pattern::Inputs::kOrdered, has_perm);
    p.joint([](const Match& m, const Graph&) {
      return m.at("first")->attr_ints("perm").size() == m.at("second")->attr_ints("perm").size();
    });
    return rewrite(graph, p, [](Graph& g, const Match& m) {
             Node& first = *m.at("first");
             const Node& second = *m.at("second");
             const auto p1 = first.attr_ints("perm"), p2 = second.attr_ints("perm");
             std::vector<std::int64_t> perm(p2.size());
             bool identity = true;
             for (std::size_t i = 0; i < p2.size(); ++i) {
               if (p2[i] < 0 || static_cast<std::size_t>(p2[i]) >= p1.size()) return false;  // malformed: leave it
               perm[i] = p1[static_cast<std::size_t>(p2[i])];
               identity = identity && perm[i] == static_cast<std::int64_t>(i);
             }
             if (identity && !g.is_graph_output(second.outputs[0])) {
               g.replace_all_uses(second.outputs[0], first.inputs[0]);  // both nodes become dead
               return true;
             }
             // Reuse the first node: it now produces the second's output with the merged perm.
             first.attributes["perm"] = Attribute::of_ints(perm);
             first.outputs[0] = second.outputs[0];
             g.erase(&second);
             return true;
           }) > 0;
  }
};

void register_all(Registrar& r) { r.add_pass<MergeTransposes>("merge_transposes", PassSchedule{1300, true}); }

}  // namespace
}  // namespace sparsebit::passes

SPARSEBIT_PLUGIN("sparsebit.passes.merge_transposes", SPARSEBIT_PLUGIN_VERSION, sparsebit::passes::register_all)
