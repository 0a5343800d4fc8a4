#pragma once
/// \file
/// Pruning: the `[sparse]` config applied to a float model.
///
///     sparsebit::PruneResult r = sparsebit::prune(model, config, registry, sample);
///     sparsebit::save_onnx(r.pruned.graph, r.pruned.meta, "pruned.onnx");
///
/// The sparser plugin scores weights (sparsebit/sdk/sparser.h); this file turns scores into a
/// smaller model. Element and N:M patterns zero weights in place (same shapes; TensorRT's
/// sparse kernels use 2:4). The channel pattern removes channels (Note [Channel removal]).
///
/// Note [Channel removal]
/// Every output channel of a prunable layer (Conv and ConvTranspose with group 1, Gemm and
/// MatMul with a constant weight) is an "atom". Walking the graph in order, each tensor that
/// carries channels records which atom sits at each position of its channel axis: channel-wise
/// ops (BatchNormalization, activations, pooling, depthwise Conv, broadcasting arithmetic with
/// constants, Flatten/Reshape into features, Transpose, Concat along the channel axis, ...)
/// carry them on; a residual Add or Mul of two such tensors unites the atoms position by
/// position, so channels meeting there are pruned as one group; Concat lays its inputs' atoms
/// side by side. An op whose channel behaviour is not known (custom domains, Softmax over
/// channels, grouped Conv, a graph output, a `[sparse] skip` layer) pins the atoms it reads:
/// they stay. Each group of united atoms then loses the `ratio` of its unpinned channels with
/// the lowest score (the sum over its layers of each layer's score over that layer's mean),
/// and every constant indexed by those channels is sliced: the producers' weights and biases,
/// BatchNormalization parameters, depthwise weights (and `group`), broadcast constants, the
/// consumers' input-channel weights and Reshape shapes. The rules are ONNX semantics, so they
/// live here in one table rather than in the op plugins.
///
/// Note [Bias compensation]
/// With `[sparse] bias_compensation = true` and calibration data, a removed weight w[o, c] gives
/// its average contribution back to the bias of output o: w[o, c] times the mean of input c under
/// that kernel tap (zero padding included) on the unpruned model, over [calibration] count
/// samples. Exact in expectation before the activation; Gemm likewise; MatMul has no bias and
/// is left alone. The layer says how (WeightedLayer's activation_sums, bias_shift, bias_input),
/// so a vendor's layer takes part too. Off by default: measured on the Fashion-MNIST models before fine-tuning
/// (docs/PRUNING.md) it lifts the CNN at 25% channels from 22% to 64-69% top-1 and 2:4 from 79%
/// to 90%, but lowers the MobileNet and unstructured pruning; fine-tuning recovers more anyway.
///
/// The shrunk model computes exactly what the "masked" model does (same shapes, the removed
/// channels' weights zeroed in producers and consumers); prune() runs both on the sample and
/// refuses to return a model where they differ.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/sparser.h"

namespace sparsebit {

/// Size of a model: float parameters, how many of them are non-zero, the serialized size, and
/// multiply-accumulates of Conv/ConvTranspose/Gemm/MatMul for one sample of the sample's shape
/// (sparse_macs counts only non-zero weights).
struct ModelStats {
  std::int64_t parameters = 0;
  std::int64_t nonzero_parameters = 0;
  std::int64_t file_bytes = 0;
  std::int64_t macs = 0;
  std::int64_t sparse_macs = 0;
};

/// One weight before and after pruning.
struct LayerSparsity {
  std::string node, op_type, weight;
  std::vector<std::int64_t> shape_before, shape_after;
  std::int64_t params_before = 0, params_after = 0, nonzero_after = 0;
  double sparsity = 0;  ///< 1 - nonzero_after / params_before
};

/// What pruning did (the report, without the models).
struct PruneSummary {
  std::string sparser;
  SparsityPattern pattern = SparsityPattern::kElement;
  std::int64_t n = 0, m = 0;  ///< N:M
  std::vector<LayerSparsity> layers;
  std::vector<std::string> notes;  ///< layers or channel groups left alone, and why
  std::int64_t groups = 0, groups_pruned = 0, channels_removed = 0;
  std::int64_t bias_compensated = 0;  ///< layers whose bias took the removed weights' mean contribution
  double max_masked_difference = 0;   ///< channel pattern: |shrunk - masked| / max|masked| on the sample
  ModelStats before, after;
};

struct PruneResult : PruneSummary {
  Model pruned;
  /// Same shapes as the input; for the channel pattern the removed channels are zero in their
  /// producers' and consumers' weights. Equal to `pruned` for element and N:M patterns.
  Model masked;
};

/// Prunes `model` as `config.sparse` says (an Error if it is unset). `sample` fixes the shapes
/// the channel analysis and the MAC counts need, and is what the shrunk model is checked on.
/// With `data` (read as [calibration] batch_size and count say), biases are compensated
/// (Note [Bias compensation]).
SPARSEBIT_API PruneResult prune(const Model& model, const Config& config, const Registry& registry,
                                const std::vector<at::Tensor>& sample, Dataset* data = nullptr);

SPARSEBIT_API ModelStats model_stats(const Model& model, const Registry& registry,
                                     const std::vector<at::Tensor>& sample);

/// The report as JSON text (before/after totals and every layer).
SPARSEBIT_API std::string prune_report_json(const PruneSummary& r);

/// Fine-tunes the float weights, biases and BatchNormalization scales of `student` (running
/// statistics frozen) to reproduce `teacher` by the distillation loss of `settings` (Adam,
/// data read in order, `settings.epochs` passes). Weights that are zero at the start stay
/// zero (element and N:M sparsity survive training). Returns the mean loss of each epoch.
using FinetuneProgressFn = std::function<void(int epoch, std::int64_t done, std::int64_t total, double loss)>;
SPARSEBIT_API std::vector<double> finetune(Model& student, const Model& teacher, const Registry& registry,
                                           const std::function<std::unique_ptr<Dataset>()>& open_train,
                                           const QatConfig& settings, const std::string& device = "cpu",
                                           const FinetuneProgressFn& progress = {});

}  // namespace sparsebit
