// The checks a quantize job reports beside its steps (pipeline_steps.h): calibration data's
// coverage of the inputs' sizes, the export's agreement with the simulation, and a warning when
// the config quantizes nothing.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "base/glob.h"
#include "base/log.h"
#include "pipeline/pipeline_steps.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::steps {

namespace {

std::string describe_dims(const InputCoverage& c) {
  std::string s = "[N";
  for (std::size_t d = 0; d < c.min.size(); ++d)
    s += ", " +
         (c.min[d] == c.max[d] ? std::to_string(c.min[d]) : std::to_string(c.min[d]) + ".." + std::to_string(c.max[d]));
  return s + "]";
}

}  // namespace

void log_coverage(const std::vector<InputCoverage>& coverage) {
  for (const auto& c : coverage) {
    bool fixed = true;
    for (std::size_t d = 0; d < c.open.size(); ++d) fixed = fixed && (!c.open[d] || c.min[d] == c.max[d]);
    logs::info("calibration data gave input '{}' the sizes {}{}", c.input, describe_dims(c),
               fixed
                   ? "; the model accepts other sizes in its open dimensions: ranges calibrated on one size can be off "
                     "for others, so calibrate on the sizes it will run on"
                   : "");
  }
}

/// Note [Agreement check]
/// After calibration (and the target), every quantize runs the model in float and quantized on
/// a few samples and compares each floating output: cosine over the whole output and SQNR
/// (10 log10 of signal over error energy). The samples are held out where the data allows (those
/// after [calibration] count, or the target's holdout), else the first calibration samples, and
/// the message says which. A cosine below AgreementCheck::kPoorCosine warns with what to try.
/// Eight samples cost two forward passes over them: small beside calibration. Weight-only runs
/// skip it: they read no data and keep host memory near one copy of the weights.
AgreementCheck check_agreement(QuantModel& qm, const Config& config, const DataSource& calib,
                               std::int64_t target_holdout) {
  constexpr std::int64_t kSamples = 8;
  c10::InferenceMode guard;
  const auto& inputs = qm.graph().inputs;
  AgreementCheck r;
  std::int64_t first = 0;
  if (target_holdout > 0) {
    r.held_out = true;
  } else if (config.calibration.count > 0) {
    auto probe = calib.open(inputs);
    const auto n = probe->num_samples();
    if (n && *n > config.calibration.count) first = config.calibration.count, r.held_out = true;
  }
  const std::int64_t take = target_holdout > 0 ? std::min(kSamples, target_holdout) : kSamples;
  SampleWindow window(calib.open(inputs), inputs, first, take);
  Batcher batches(window, inputs,
                  std::max<std::int64_t>(1, std::min<std::int64_t>(config.calibration.batch_size, take)), take);
  const at::Device device(config.calibration.device);
  const auto& outs = qm.graph().outputs;
  std::vector<double> ff(outs.size(), 0), qq(outs.size(), 0), fq(outs.size(), 0), ee(outs.size(), 0);
  std::vector<std::int64_t> elements(outs.size(), 0), bad_float(outs.size(), 0), bad_quantized(outs.size(), 0);
  std::vector<bool> floating(outs.size(), false);
  while (auto b = batches.next()) {
    std::vector<at::Tensor> in;
    for (auto& t : b->inputs) in.push_back(t.to(device));
    qm.set_quant(false, false);
    const auto f = qm.forward(in);
    qm.set_quant(true, true);
    const auto q = qm.forward(in);
    for (std::size_t i = 0; i < outs.size() && i < f.size() && i < q.size(); ++i) {
      if (!f[i].defined() || f[i].is_nested() || !f[i].is_floating_point() || f[i].sizes() != q[i].sizes()) continue;
      floating[i] = true;
      // Scored where both are finite; a NaN or infinity counted, never zeroed into agreement.
      const at::Tensor finite_f = at::isfinite(f[i]), finite_q = at::isfinite(q[i]), both = finite_f & finite_q;
      elements[i] += f[i].numel();
      bad_float[i] += f[i].numel() - finite_f.sum().item<std::int64_t>();
      bad_quantized[i] += (finite_f & finite_q.logical_not()).sum().item<std::int64_t>();
      const at::Tensor a = f[i].to(at::kDouble).masked_fill(both.logical_not(), 0),
                       c = q[i].to(at::kDouble).masked_fill(both.logical_not(), 0);
      ff[i] += a.mul(a).sum().item<double>();
      qq[i] += c.mul(c).sum().item<double>();
      fq[i] += a.mul(c).sum().item<double>();
      ee[i] += (a - c).pow(2).sum().item<double>();
    }
    r.samples += b->rows;
  }
  qm.set_quant(false, false);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (!floating[i]) continue;
    AgreementCheck::Output o;
    o.name = outs[i].name;
    o.elements = elements[i];
    o.not_finite_float = bad_float[i];
    o.not_finite_quantized = bad_quantized[i];
    if (o.not_finite_float + o.not_finite_quantized >= o.elements) {  // nothing left to compare
      o.cosine = o.sqnr_db = std::numeric_limits<double>::quiet_NaN();
    } else {
      o.cosine = ff[i] > 0 && qq[i] > 0 ? fq[i] / std::sqrt(ff[i] * qq[i]) : (ee[i] == 0 ? 1.0 : 0.0);
      o.sqnr_db =
          ee[i] > 0 ? 10 * std::log10(std::max(ff[i], 1e-300) / ee[i]) : std::numeric_limits<double>::infinity();
    }
    r.poor = r.poor || !(o.cosine >= AgreementCheck::kPoorCosine) || o.not_finite_quantized > 0;
    r.outputs.push_back(o);
  }
  return r;
}

void log_agreement(const AgreementCheck& a) {
  const std::string on = std::to_string(a.samples) + (a.held_out ? " held-out samples" : " calibration samples");
  for (const auto& o : a.outputs) {
    if (std::isnan(o.cosine))
      logs::warn(
          "quantized vs float on {}: output '{}' is NaN or infinite on every element ({} in float, {} "
          "quantized only): no agreement can be measured; check that the data is what the model expects",
          on, o.name, o.not_finite_float, o.not_finite_quantized);
    else
      logs::info("quantized vs float on {}: output '{}' cosine {:.4f}, SQNR {:.1f} dB", on, o.name, o.cosine,
                 o.sqnr_db);
    if (!std::isnan(o.cosine) && o.not_finite_float > 0)
      logs::warn(
          "output '{}' of the float model is NaN or infinite at {} of its {} values on {}; the agreement "
          "above leaves them out",
          o.name, o.not_finite_float, o.elements, on);
    if (!std::isnan(o.cosine) && o.not_finite_quantized > 0)
      logs::warn(
          "output '{}' of the quantized model is NaN or infinite at {} of its {} values on {} where the "
          "float model's is finite: a layer overflows its quantized range (`sparsebit profile` names it)",
          o.name, o.not_finite_quantized, o.elements, on);
  }
  if (a.poor)
    logs::warn(
        "the quantized model agrees poorly with float (cosine below {} on {}): `sparsebit profile` shows which "
        "layers lose it, --target \"cosine>=0.99\" keeps the most sensitive ones in higher precision, and another "
        "[a] observer (auto, mse, percentile) may do better",
        AgreementCheck::kPoorCosine, on);
}

/// Nothing quantized is almost never what the user meant: say why, loudly.
void warn_if_nothing_quantized(QuantModel& qm, const Config& config) {
  std::size_t active = 0, in_bodies = 0;
  for (const auto& s : qm.slots()) {
    active += s.active();
    in_bodies += s.node_index >= qm.graph().num_nodes();
  }
  if (active > 0) return;
  const std::size_t body_nodes = qm.executor().flat_size() - qm.graph().num_nodes();
  std::string why = std::to_string(qm.slots().size()) + " quantizable inputs were fused away by backend '" +
                    config.backend + "''s placement rules and the fuse passes";
  std::size_t skipped = 0;
  for (const Node* n : qm.graph().nodes()) skipped += node_matches_any(n->name, config.skip);
  if (qm.slots().empty())
    why = skipped > 0 ? "the skip globs keep " + std::to_string(skipped) +
                            " nodes float, and no other node has an input its op quantizes"
                      : "no node of the model has an input its op quantizes";
  if (body_nodes > 0)
    why += "; " + std::to_string(body_nodes) + " of the model's " + std::to_string(qm.executor().flat_size()) +
           " nodes sit inside If/Loop/Scan bodies (" + std::to_string(in_bodies) + " of the quantizable inputs)";
  logs::warn(
      "NOTHING IS QUANTIZED: 0 quantized inputs ({}); the output runs in float. `sparsebit inspect` lists the ops "
      "and which have a QModule; another backend may quantize what this one leaves",
      why);
}

}  // namespace sparsebit::steps
