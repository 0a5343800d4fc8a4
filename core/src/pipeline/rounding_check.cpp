// Note [Solved weights against rounding]
// AWQ's scales and clips, GPTQ's updates and a clip search each lower a layer's output error on
// the calibration data, and each counts plain rounding among its choices, so on that measure none
// does worse than round to nearest. The model's loss is another measure: on a small language model
// AWQ's clips lowered every layer's error and the divergence from float's predictions, yet raised
// the perplexity (docs/WEIGHT_ONLY.md). So a weight-only run whose weights were solved is scored
// against round to nearest on the same grid by the model's own loss: for a language model (one
// [batch, time] input of token ids, a first output of [batch, time, vocabulary] scores) the
// next-token loss, the labels being the inputs shifted by one; for any other model the output
// error relative to float. The scores are taken on samples the weights were not solved on where
// the data holds them (those past [calibration] count), else on the calibration samples, and
// compared sample by sample: the rounded model replaces the solved one only where its loss is
// lower by more than two standard errors of the mean difference, so a margin the samples' scatter
// explains keeps what the solver chose (on a small model trained on its calibration text, its
// loss there favoured rounding while AWQ did better on held-out text). The log and the report give
// both losses. "Solved" is anything beyond the default schedule and plain rounding: a pass the
// config turns on, a [w] quantizer other than rtn, rtn's clip search. The rounded model is built
// from the float model with those left out; scoring costs round to nearest's calibration and
// three forward passes over at most kMaxSamples samples (two for a language model).

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <variant>

#include "base/log.h"
#include "pipeline/pipeline_steps.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::steps {

namespace {

constexpr std::int64_t kMaxSamples = 128;

bool plain_rounding(const std::string& quantizer) { return quantizer == "rtn" || quantizer == "uniform"; }

bool clip_search(const Options& o) {
  auto it = o.values().find("clip_search");
  if (it == o.values().end()) return false;
  const bool* on = std::get_if<bool>(&it->second);
  return on && *on;
}

/// Each sample's mean -log p(next token) over every position but the last, [batch] in double:
/// where `out` scores the vocabulary at each position of `ids`; std::nullopt where the shapes say
/// it does not.
std::optional<at::Tensor> next_token_losses(const at::Tensor& ids, const at::Tensor& out) {
  if (!at::isIntegralType(ids.scalar_type(), false) || ids.dim() != 2 || ids.size(1) < 2) return std::nullopt;
  if (!out.defined() || !out.is_floating_point() || out.dim() != 3 || out.size(0) != ids.size(0) ||
      out.size(1) != ids.size(1))
    return std::nullopt;
  const at::Tensor t = ids.to(out.device(), at::kLong);
  if (t.min().item<std::int64_t>() < 0 || t.max().item<std::int64_t>() >= out.size(2)) return std::nullopt;
  const at::Tensor logp = at::log_softmax(out.slice(1, 0, -1).to(at::kDouble), -1);
  return -logp.gather(-1, t.slice(1, 1).unsqueeze(-1)).squeeze(-1).mean(1).cpu();
}

/// Each sample's sum of squared differences [rows] (the whole batch as one where dim 0 is not
/// the samples).
at::Tensor squared_error(const at::Tensor& a, const at::Tensor& b, std::int64_t rows) {
  const at::Tensor e = (a.to(at::kDouble) - b.to(at::kDouble)).pow(2);
  if (e.dim() == 0 || e.size(0) != rows) return e.sum().reshape({1}).cpu();
  return e.reshape({rows, -1}).sum(1).cpu();
}

}  // namespace

std::string weight_solver(const Config& config) {
  std::vector<std::string> parts;
  for (const auto& [pass, on] : config.passes.switches)
    if (on) parts.push_back(pass);
  for (const auto& pass : config.passes.extra) parts.push_back(pass);
  if (!plain_rounding(config.w.quantizer)) parts.push_back(config.w.quantizer);
  else if (clip_search(config.w.quantizer_options)) parts.push_back(config.w.quantizer + " clip search");
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

Config rounding_config(const Config& config) {
  Config c = config;
  for (auto it = c.passes.switches.begin(); it != c.passes.switches.end();) {
    if (it->second) c.passes.options.erase(it->first), it = c.passes.switches.erase(it);
    else ++it;
  }
  for (const auto& pass : c.passes.extra) c.passes.options.erase(pass);
  c.passes.extra.clear();
  c.w.quantizer = "rtn";
  c.w.quantizer_options = Options(config.w.quantizer_options.where());
  // Plain rounding needs no layer's inputs: streaming calibration keeps no cached activations
  // beside the solved model.
  c.calibration.mode = "streaming";
  c.calibration.rounding_check = false;
  return c;
}

RoundingCheck compare_with_rounding(QuantModel& solved, QuantModel& rounded, const Config& config,
                                    const DataSource& calib) {
  c10::InferenceMode guard;
  const auto& inputs = solved.graph().inputs;
  RoundingCheck r;
  // Samples the weights were not solved on where the data has them (after [calibration] count),
  // as the agreement check takes them; else the calibration samples.
  std::int64_t first = 0, take = kMaxSamples;
  if (config.calibration.count > 0) {
    const auto n = calib.open(inputs)->num_samples();
    if (n && *n > config.calibration.count) first = config.calibration.count, r.held_out = true;
    else take = std::min<std::int64_t>(take, config.calibration.count);
  }
  SampleWindow window(calib.open(inputs), inputs, first, take);
  Batcher batches(window, inputs, std::max(1, config.calibration.batch_size), take);
  const at::Device device(config.calibration.device);
  std::optional<bool> language_model;  // decided by the first batch
  // Per sample: the solved model's loss less the rounded one's (output errors before dividing by
  // the float outputs' energy).
  std::vector<at::Tensor> differences;
  double solved_sum = 0, rounded_sum = 0, float_sum = 0;
  while (auto b = batches.next()) {
    std::vector<at::Tensor> in;
    for (auto& t : b->inputs) in.push_back(t.to(device));
    solved.set_quant(true, true);
    rounded.set_quant(true, true);
    const auto s = solved.forward(in), q = rounded.forward(in);
    if (s.empty() || q.empty()) throw Error("the rounding check: the model returned no outputs");
    if (!language_model) language_model = in.size() == 1 && next_token_losses(in[0], s[0]).has_value();
    if (*language_model) {
      const auto ls = next_token_losses(in[0], s[0]), lq = next_token_losses(in[0], q[0]);
      if (!ls || !lq)
        throw Error("the rounding check: a batch of '" + inputs[0].name + "' is not token ids the model scores");
      solved_sum += ls->sum().item<double>(), rounded_sum += lq->sum().item<double>();
      differences.push_back(*ls - *lq);
    } else {
      rounded.set_quant(false, false);
      const auto f = rounded.forward(in);
      at::Tensor d;
      for (std::size_t i = 0; i < f.size() && i < s.size() && i < q.size(); ++i) {
        if (!f[i].defined() || !f[i].is_floating_point() || f[i].sizes() != s[i].sizes() ||
            f[i].sizes() != q[i].sizes())
          continue;
        float_sum += f[i].to(at::kDouble).pow(2).sum().item<double>();
        const at::Tensor es = squared_error(s[i], f[i], b->rows), eq = squared_error(q[i], f[i], b->rows);
        solved_sum += es.sum().item<double>(), rounded_sum += eq.sum().item<double>();
        const at::Tensor di = es - eq;
        if (!d.defined()) d = di;
        else if (d.sizes() == di.sizes()) d = d + di;
        else d = (d.sum() + di.sum()).reshape({1});  // outputs that do not all count samples
      }
      if (d.defined()) differences.push_back(d);
    }
    r.samples += b->rows;
  }
  solved.set_quant(true, true);
  rounded.set_quant(true, true);
  if (r.samples == 0) throw Error("the rounding check: the calibration data gave no samples");
  at::Tensor d = differences.empty() ? at::zeros({1}, at::kDouble) : at::cat(differences);
  if (*language_model) {
    r.loss = "next-token loss";
    r.solved = solved_sum / static_cast<double>(r.samples);
    r.rounded = rounded_sum / static_cast<double>(r.samples);
  } else {
    r.loss = "output error";
    const double energy = float_sum > 0 ? float_sum : 1;
    r.solved = solved_sum / energy, r.rounded = rounded_sum / energy;
    d = d * (static_cast<double>(d.numel()) / energy);  // their mean: r.solved - r.rounded
  }
  // Rounding replaces the solved weights only where it does better beyond the samples' scatter:
  // the mean difference at least two standard errors above zero.
  if (d.numel() >= 2) r.standard_error = (d.std() / std::sqrt(static_cast<double>(d.numel()))).item<double>();
  r.kept_solved = !(d.numel() >= 2 && d.mean().item<double>() > 2 * r.standard_error);
  return r;
}

void log_rounding_check(const RoundingCheck& r) {
  const std::string scores = fmt::format(
      "{} on {} {} samples: {} {:.6g}, round to nearest {:.6g} (standard error of the difference {:.2g})", r.loss,
      r.samples, r.held_out ? "held-out" : "calibration", r.solver, r.solved, r.rounded, r.standard_error);
  if (r.kept_solved) {
    logs::info("weights checked against rounding: {}", scores);
    return;
  }
  logs::warn(
      "weights checked against rounding: {}; the export keeps round to nearest, whose loss is lower by more than two "
      "standard errors. "
      "The solved weights fit each layer's calibration inputs better but not the model's output on them: "
      "try more calibration samples, or rounding_check = false under [calibration] to keep them",
      scores);
}

}  // namespace sparsebit::steps
