// `sparsebit config convert`: the original toolkit's YAML config written as Sparsebit's TOML.

#include <spdlog/fmt/fmt.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "common.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit::cli {
namespace {

int cmd_config_convert(const std::string& in, const std::string& out) {
  if (!sb::is_yaml_config(in))
    throw sb::Error(in + ": not a .yaml or .yml file; `config convert` reads the original toolkit's YAML configs");
  check_distinct_paths({{"the YAML config", in}},
                       out.empty() ? std::vector<PathRole>{} : std::vector<PathRole>{{"-o", out}});
  std::ifstream file(in);
  if (!file) throw sb::Error(in + ": config file cannot be read");
  std::stringstream text;
  text << file.rdbuf();
  const std::string toml = sb::yaml_config_to_toml(text.str(), in);
  sb::Config::from_string(toml, in);  // what -c would read: refused here, not at the next run
  if (out.empty()) {
    std::cout << toml;
    return 0;
  }
  sb::AtomicFile file_out(out);
  file_out.write(toml);
  file_out.commit();
  sparsebit::sdk::log_info(fmt::format("wrote {}", sb::displayed(out)));
  return 0;
}

}  // namespace

Command add_config(CLI::App& app) {
  struct Args {
    std::string in, out;
  };
  auto a = std::make_shared<Args>();
  auto* config = app.add_subcommand("config", "Work with config files");
  config->require_subcommand(1);
  auto* convert = config->add_subcommand(
      "convert", "Write the original toolkit's YAML config (BACKEND, W, A, ...) as Sparsebit's TOML");
  convert->add_option("input", a->in, "YAML config (.yaml, .yml)")->required();
  convert->add_option("-o,--output", a->out, "TOML file to write (default: standard output)");
  return {config, [a] { return cmd_config_convert(a->in, a->out); }};
}

}  // namespace sparsebit::cli
