// `sparsebit profile`: per-layer quantization error as JSON and an HTML chart.

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

struct ProfileArgs {
  std::string model, config, calib, output = "profile", mode = "both", device;
  std::int64_t samples = 64;
  std::int64_t calib_count = -1;
};

int cmd_profile(const ProfileArgs& a, const GlobalOptions& g) {
  if (a.mode != "both" && a.mode != "accumulated" && a.mode != "single")
    throw sb::Error("--mode must be both, accumulated or single");
  sb::Config config = sb::Config::from_file(a.config);
  if (a.calib_count >= 0) config.calibration.count = static_cast<int>(a.calib_count);
  if (!a.device.empty()) config.calibration.device = a.device;
  // -o is a path without extension: an empty one (or a folder) would write hidden ".json" files.
  const std::string stem = std::filesystem::path(a.output).filename().string();
  if (stem.empty() || stem == "." || stem == "..")
    throw sb::Error("-o '" + sb::printable(a.output) +
                    "' names no file: give a path without extension (profile writes PATH.json and PATH.html)");
  check_distinct_paths({{"the model", a.model}, {"-c", a.config}, {"--calib", a.calib}},
                       {{"-o (.json)", a.output + ".json", true}, {"-o (.html)", a.output + ".html"}});
  sb::AtomicFile json_out(a.output + ".json"), html_out(a.output + ".html");
  // The model `sparsebit quantize` would calibrate with this config (Note [Session]).
  const sb::Session session(config);
  const sb::DataSource calib(a.calib);
  sb::QuantModel qm = session.quant_model(session.prepare(session.load(a.model, calib), calib), calib);
  {
    sb::cli::Progress bar("calibrating", !g.quiet);
    session.calibrate(qm, calib,
                      [&](const std::string& step, std::int64_t done, std::int64_t total, const std::string&) {
                        if (!step.empty()) bar.update(done, total);
                      });
  }
  sb::ProfileOptions opt;
  opt.samples = a.samples;
  opt.accumulated = a.mode != "single";
  opt.single = a.mode != "accumulated";
  sb::cli::Progress bar("profiling layers", !g.quiet);
  opt.progress = [&](std::int64_t done, std::int64_t total) { bar.update(done, total); };
  sb::ProfileReport r = session.profile(qm, calib, opt);
  bar.finish();
  json_out.write(sb::profile_json(r));
  html_out.write(sb::profile_html(r));
  json_out.commit();
  html_out.commit();
  std::printf("every layer quantized, at %s: MSE %.4g, cosine %.6f, SQNR %.2f dB (%lld samples)\n", r.output.c_str(),
              r.whole.mse, r.whole.cosine, r.whole.sqnr_db, static_cast<long long>(r.samples));
  auto worst = r.single.empty() ? r.accumulated : r.single;
  std::sort(worst.begin(), worst.end(), [](const sb::LayerError& x, const sb::LayerError& y) { return x.mse > y.mse; });
  std::printf("\nmost sensitive layers (%s)\n  %-40s %-18s %12s %10s %10s\n",
              r.single.empty() ? "accumulated" : "one at a time", "node", "op", "MSE", "cosine", "SQNR dB");
  for (std::size_t i = 0; i < worst.size() && i < 10; ++i)
    std::printf("  %-40s %-18s %12.4g %10.6f %10.2f\n", worst[i].node.c_str(), worst[i].op_type.c_str(), worst[i].mse,
                worst[i].cosine, worst[i].sqnr_db);
  sparsebit::sdk::log_info(fmt::format("wrote {}.json and {}.html", sb::displayed(a.output), sb::displayed(a.output)));
  return 0;
}

}  // namespace

Command add_profile(CLI::App& app, const GlobalOptions& g) {
  auto a = std::make_shared<ProfileArgs>();
  auto* prof =
      app.add_subcommand("profile", "Per-layer quantization error (MSE, cosine, SQNR): JSON and an HTML chart");
  prof->add_option("model", a->model, "Float ONNX model")->required();
  prof->add_option("-c,--config", a->config, "TOML config (see configs/), or the original toolkit's YAML (.yaml)")
      ->required();
  prof->add_option("--calib", a->calib,
                   "Calibration data (also profiled on): .npy folder, ONNX test-data folder, IDX file")
      ->required();
  prof->add_option("-o,--output", a->output,
                   "Report path without extension: writes OUTPUT.json and OUTPUT.html (default: profile)");
  prof->add_option("--samples", a->samples, "Samples to profile on (default 64)")->check(kPositiveInt);
  prof->add_option("--mode", a->mode, "both | accumulated (every layer quantized) | single (one layer at a time)");
  prof->add_option("--calib-count", a->calib_count, "Calibration samples, 0 = all (overrides [calibration] count)")
      ->check(kNonNegativeInt);
  prof->add_option("--device", a->device, "cpu or cuda[:N] (overrides [calibration] device)")->check(kDevice);
  return {prof, [a, &g] { return cmd_profile(*a, g); }};
}

}  // namespace sparsebit::cli
