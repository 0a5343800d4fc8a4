#include "common.h"

#include <ATen/Parallel.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "sparsebit/core/distributed.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit::cli {

void setup_logging(const GlobalOptions& g) {
  using sparsebit::sdk::LogLevel;
  sparsebit::sdk::log_to_stderr(g.quiet ? LogLevel::kWarn : g.verbose > 0 ? LogLevel::kDebug : LogLevel::kInfo);
  sb::escape_log_messages();
  const sb::ThreadChoice t = sb::choose_threads(g.threads);  // Note [Threads per process]
  if (t.capped)
    sparsebit::sdk::log_warn(
        fmt::format("--threads {}: this machine has {} cores; using {}", g.threads, t.cores, t.threads));
  at::set_num_threads(t.threads);
  if (sb::use_one_blas_thread())  // Note [One thread pool]
    sparsebit::sdk::log_debug("OpenBLAS runs on the calling thread; ATen's threads do the parallel work");
}

CLI::Option* add_nproc_option(CLI::App& app, int& nproc) {
  return app
      .add_option("--nproc", nproc,
                  "Run as N worker processes on this machine (one per GPU with --device cuda); calibration "
                  "data and training batches are divided between them (docs/DISTRIBUTED.md)")
      ->check(kPositiveInt);
}

CLI::Validator whole_number_from(long long low) {
  return CLI::Validator(
      [low](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end || errno || x < low)
          return "must be a whole number of at least " + std::to_string(low) + ", got '" + sb::printable(v, 40) + "'";
        return {};
      },
      "N>=" + std::to_string(low));
}
const CLI::Validator kPositiveInt = whole_number_from(1);
const CLI::Validator kNonNegativeInt = whole_number_from(0);
const CLI::Validator kPositiveFinite(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !std::isfinite(x) || !(x > 0))
        return "must be a finite number above 0, got '" + sb::printable(v, 40) + "'";
      return {};
    },
    "X>0");

const CLI::Validator kDevice(
    [](std::string& v) -> std::string {
      if (std::regex_match(v, std::regex("cpu|cuda(:[0-9]{1,3})?"))) return {};
      return "must be cpu, cuda or cuda:N, got '" + sb::printable(v, 40) + "'";
    },
    "DEVICE");

std::string one_line(const std::string& message) { return sb::one_line_message(message); }

int argument_error(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);
  std::string what = e.what();
  for (const char* noise : {"\nRun with --help for more information.", "\n"})
    for (std::size_t at; (at = what.find(noise)) != std::string::npos;) what.replace(at, std::strlen(noise), " ");
  std::fprintf(stderr, "error: %s (see sparsebit --help)\n", sb::printable(what, 500).c_str());
  return 1;
}

std::string dims_text(const sb::ValueInfo& v) {
  if (!v.has_shape) return "?";
  std::string s = "[";
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    const auto& d = v.shape[i];
    s += (i ? ", " : "") + (d.value >= 0 ? std::to_string(d.value) : d.param.empty() ? std::string("?") : d.param);
  }
  return s + "]";
}

json value_info_json(const sb::ValueInfo& v) {
  json dims = json::array();
  for (const auto& d : v.shape)
    dims.push_back(d.value >= 0 ? json(d.value) : d.param.empty() ? json(nullptr) : json(d.param));
  return {{"name", v.name}, {"type", sb::onnx_type_name(v.elem_type)}, {"shape", v.has_shape ? dims : json(nullptr)}};
}

}  // namespace sparsebit::cli
