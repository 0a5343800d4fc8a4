// Magnitude pruning: a weight's importance is its absolute value (Note [Sparsity patterns]).

#include <ATen/ATen.h>

#include "sparsebit/sdk/plugin.h"
#include "sparsebit/sdk/registrar.h"

namespace sparsebit::sparsers {
namespace {

class L1Unstructured : public Sparser {
 public:
  explicit L1Unstructured(const SparserContext&) {}
  SparsityPattern pattern() const override { return SparsityPattern::kElement; }
  at::Tensor scores(const SparseWeight& w) override { return w.weight.detach().abs(); }
};

void register_all(Registrar& r) { r.add_sparser<L1Unstructured>("l1_unstructured"); }

}  // namespace
}  // namespace sparsebit::sparsers

SPARSEBIT_PLUGIN("sparsebit.sparsers.l1_unstructured", SPARSEBIT_PLUGIN_VERSION, sparsebit::sparsers::register_all)
