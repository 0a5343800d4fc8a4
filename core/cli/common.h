#pragma once
// What the commands of the `sparsebit` CLI share: the global options, argument and path checks,
// progress bars, and the Command each cmd_*.cpp file adds to the application.

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "progress.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/graph.h"

namespace sb = sparsebit;

namespace sparsebit::cli {

using nlohmann::json;

struct GlobalOptions {
  int verbose = 0;
  bool quiet = false;
  int threads = 0;
  std::string memory_limit;  // Note [Memory limit]; empty: the default
};

/// A subcommand and what runs when it was given (its arguments live in the closure).
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_quantize(CLI::App& app, const GlobalOptions& g);
Command add_plugins(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_simplify(CLI::App& app);
Command add_profile(CLI::App& app, const GlobalOptions& g);
Command add_qat(CLI::App& app, const GlobalOptions& g);
Command add_prune(CLI::App& app, const GlobalOptions& g);
Command add_config(CLI::App& app);

/// Log level and thread count from the global options.
void setup_logging(const GlobalOptions& g);

/// For --nproc (launch.cpp): the command line the workers repeat.
void remember_command_line(int argc, char** argv);
/// With nproc > 1 in a process that is not a worker yet: runs the command in `nproc` worker
/// processes and returns the run's exit status; nullopt: run it here.
std::optional<int> launch_workers(int nproc);
/// The --nproc option of quantize, qat and prune.
CLI::Option* add_nproc_option(CLI::App& app, int& nproc);

// Argument checks with short messages; CLI11 prefixes the option's name.
/// A whole number of at least `low`.
CLI::Validator whole_number_from(long long low);
extern const CLI::Validator kPositiveInt;
extern const CLI::Validator kNonNegativeInt;
extern const CLI::Validator kPositiveFinite;
extern const CLI::Validator kDevice;

/// The final guard on every message: one line, no control characters, bounded length (the parts
/// quoted from untrusted input are bounded where they are quoted).
std::string one_line(const std::string& message);
/// One line for a command-line error, exit status 1 (help and --version exit 0 as CLI11 says).
int argument_error(CLI::App& app, const CLI::ParseError& e);

std::string dims_text(const ValueInfo& v);
json value_info_json(const ValueInfo& v);

/// The CLI's view of the pipeline's progress: one bar per step, closed when the step ends.
struct ProgressBars {
  bool enabled;
  std::unique_ptr<Progress> bar;
  std::string step;
  StepProgressFn fn() {
    return [this](const std::string& name, std::int64_t done, std::int64_t total, const std::string& note) {
      if (name != step) {
        bar.reset();
        step = name;
        if (!name.empty()) bar = std::make_unique<Progress>(name, enabled);
      }
      if (bar) bar->update(done, total, note);
    };
  }
};

}  // namespace sparsebit::cli
