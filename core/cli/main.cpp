// The `sparsebit` command line: the global options, one subcommand per cmd_*.cpp file, and the
// one place errors become a message and an exit status.

#include <c10/util/Exception.h>
#include <spdlog/fmt/fmt.h>

#include <new>
#include <string>
#include <vector>

#include "common.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/cpu_allocator.h"
#include "sparsebit/core/distributed.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

using namespace sparsebit::cli;

namespace {
/// The error line; in a distributed run the other processes learn of it too.
int fail(const std::string& message) {
  const std::string line = one_line(message);
  sparsebit::sdk::log_error(fmt::format("{}", line));
  sb::report_distributed_failure(line);
  sb::shutdown_distributed();
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  remember_command_line(argc, argv);
  CLI::App app{"Sparsebit: quantize ONNX models to low-bit QDQ ONNX for ONNX Runtime and TensorRT"};
  app.require_subcommand(1);
  app.fallthrough();  // -v, -q and --threads work before or after the subcommand
  app.set_version_flag("--version", std::string("sparsebit ") + SPARSEBIT_VERSION);
  GlobalOptions g;
  app.add_flag("-v,--verbose", g.verbose, "More log output");
  app.add_flag("-q,--quiet", g.quiet, "Only warnings and errors");
  app.add_option("--threads", g.threads, "Intra-op threads for LibTorch (default and most: all cores)")
      ->check(kPositiveInt);
  app.add_option("--memory-limit", g.memory_limit,
                 "Largest CPU memory the run's tensors may take, as 8GiB, 512MiB or 75% (default: 90% of this "
                 "machine's memory); a node that would pass it is refused by name");

  const std::vector<Command> commands = {add_quantize(app, g), add_plugins(app), add_inspect(app),  add_simplify(app),
                                         add_profile(app, g),  add_qat(app, g),  add_prune(app, g), add_config(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return argument_error(app, e);
  }
  try {
    setup_logging(g);
    sb::install_caching_cpu_allocator();  // Note [Caching CPU allocator]
    if (!g.memory_limit.empty()) sb::set_memory_limit(sb::parse_memory_size(g.memory_limit, "--memory-limit"));
    std::string command = "sparsebit";
    for (int i = 1; i < argc && command.size() < 300; ++i) command += std::string(" ") + argv[i];
    sb::install_interrupt_cleanup(command);  // Note [Interrupted runs]
    const sb::FilesReadScope run;            // Note [Files a run read]: the command is the run
    for (const auto& c : commands)
      if (c.app->parsed()) {
        const int status = c.run();
        sb::shutdown_distributed();
        return status;
      }
  } catch (const sb::Error& e) {
    return fail(e.what());
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace());
  } catch (const sb::MemoryLimitExceeded& e) {
    return fail(e.what() +
                std::string("; try a smaller --batch-size, or raise the limit if the machine has the memory"));
  } catch (const std::bad_alloc&) {
    return fail("out of memory; try a smaller --batch-size");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
