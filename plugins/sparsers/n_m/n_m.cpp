// N:M semi-structured pruning by magnitude: in every M consecutive weights along the input-channel
// axis the N largest stay (2:4 by default, set by `[sparse] granularity`), the pattern of
// TensorRT's sparse kernels.

#include <ATen/ATen.h>

#include "sparsebit/sdk/plugin.h"
#include "sparsebit/sdk/registrar.h"

namespace sparsebit::sparsers {
namespace {

class NM : public Sparser {
 public:
  explicit NM(const SparserContext&) {}
  SparsityPattern pattern() const override { return SparsityPattern::kNM; }
  at::Tensor scores(const SparseWeight& w) override { return w.weight.detach().abs(); }
};

void register_all(Registrar& r) { r.add_sparser<NM>("n_m"); }

}  // namespace
}  // namespace sparsebit::sparsers

SPARSEBIT_PLUGIN("sparsebit.sparsers.n_m", SPARSEBIT_PLUGIN_VERSION, sparsebit::sparsers::register_all)
