// Channel pruning by L1 norm: an output channel's importance is the sum of the absolute values
// of its weights (the filter norm criterion), so the weakest filters are removed.

#include <ATen/ATen.h>

#include "sparsebit/sdk/plugin.h"
#include "sparsebit/sdk/registrar.h"

namespace sparsebit::sparsers {
namespace {

class L1Structured : public Sparser {
 public:
  explicit L1Structured(const SparserContext&) {}
  SparsityPattern pattern() const override { return SparsityPattern::kChannel; }
  at::Tensor scores(const SparseWeight& w) override {
    return w.weight.detach().abs().transpose(0, w.channel_axis).reshape({w.weight.size(w.channel_axis), -1}).sum(1);
  }
};

void register_all(Registrar& r) { r.add_sparser<L1Structured>("l1_structured"); }

}  // namespace
}  // namespace sparsebit::sparsers

SPARSEBIT_PLUGIN("sparsebit.sparsers.l1_structured", SPARSEBIT_PLUGIN_VERSION, sparsebit::sparsers::register_all)
