// `sparsebit plugins`: list the plugins found, loaded or refused, what each registers, and the
// schedule of passes a run with the config would follow.

#include <iostream>

#include "sparsebit/core/session.h"
#include "sparsebit/sdk/version.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

int cmd_plugins(const std::string& config_path, bool as_json) {
  const sb::Session session(config_path.empty() ? sb::Config() : sb::Config::from_file(config_path));
  const sb::Registry& registry = session.registry();
  const sb::Config& config = session.config();
  const auto host = sb::host_fingerprint();
  const auto schedule = session.schedule();
  auto order_of = [&](const std::string& pass) -> json {
    const auto* place = registry.pass_schedule(pass);
    return place ? json(place->order) : json(nullptr);
  };
  if (as_json) {
    json j;
    j["host"] = {
        {"sdk_version", std::to_string(sb::sdk::kSdkVersionMajor) + "." + std::to_string(sb::sdk::kSdkVersionMinor)},
        {"abi_version", sb::sdk::kAbiVersion},
        {"torch_version", host.torch_version},
        {"cuda", host.cuda},
        {"cxx11_abi", host.cxx11_abi},
        {"compiler", host.compiler}};
    j["searched"] = registry.searched_folders();
    json list = json::array();
    for (const auto& p : registry.plugins()) {
      json e = {{"file", p.file},       {"status", p.status_name()},    {"name", p.name},
                {"version", p.version}, {"sdk_version", p.sdk_version}, {"registered", p.registered}};
      e["fingerprint"] = {
          {"torch_version", p.torch_version}, {"cuda", p.cuda}, {"cxx11_abi", p.cxx11_abi}, {"compiler", p.compiler}};
      if (!p.reason.empty()) e["reason"] = p.reason;
      if (!p.gate.empty()) e["gate"] = p.gate;
      list.push_back(e);
    }
    j["plugins"] = list;
    json passes = json::array();
    for (const auto& e : schedule)
      passes.push_back({{"pass", e.pass},
                        {"plugin", registry.pass(e.pass)->plugin},
                        {"order", order_of(e.pass)},
                        {"enabled", e.enabled}});
    j["schedule"] = {{"backend", config.backend}, {"passes", passes}};
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::cout << "host: SDK " << sb::sdk::kSdkVersionMajor << "." << sb::sdk::kSdkVersionMinor << ", ABI "
            << sb::sdk::kAbiVersion << ", LibTorch " << host.torch_version << ", cuda=" << host.cuda
            << ", cxx11_abi=" << host.cxx11_abi << ", " << host.compiler << "\n";
  std::cout << "searched:";
  for (const auto& f : registry.searched_folders()) std::cout << " " << f;
  std::cout << "\n\n";
  for (const auto& p : registry.plugins()) {
    std::cout << p.status_name() << "  " << (p.name.empty() ? "?" : p.name) << " " << p.version << "  (" << p.file
              << ")\n";
    if (!p.reason.empty()) std::cout << "    reason: " << p.reason << "\n";
    if (!p.registered.empty()) {
      std::cout << "    registers:";
      for (const auto& r : p.registered) std::cout << " " << r;
      std::cout << "\n";
    }
  }
  if (registry.plugins().empty()) std::cout << "no plugins found\n";
  std::cout << "\npass schedule (backend " << config.backend << "), in the order passes run within a stage:\n";
  for (const auto& e : schedule) {
    const json order = order_of(e.pass);
    std::cout << "  " << (e.enabled ? "on " : "off") << "  " << e.pass << "  ("
              << (order.is_null() ? std::string("no default place") : "order " + order.dump()) << ", "
              << registry.pass(e.pass)->plugin << ")\n";
  }
  return 0;
}

}  // namespace

Command add_plugins(CLI::App& app) {
  struct Args {
    std::string config;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* plugins = app.add_subcommand(
      "plugins", "List plugins found, loaded or refused, what each registers, and the pass schedule");
  plugins->add_flag("--json", a->json, "Machine-readable output");
  plugins->add_option("-c,--config", a->config,
                      "Also search the config's [plugins] paths, apply enable/disable, and show its [schedule]");
  return {plugins, [a] { return cmd_plugins(a->config, a->json); }};
}

}  // namespace sparsebit::cli
