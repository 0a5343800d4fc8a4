#include "sparsebit/sdk/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace sparsebit::sdk {

void log(LogLevel level, const std::string& message) {
  switch (level) {
    case LogLevel::kDebug: spdlog::debug("{}", message); break;
    case LogLevel::kInfo: spdlog::info("{}", message); break;
    case LogLevel::kWarn: spdlog::warn("{}", message); break;
    case LogLevel::kError: spdlog::error("{}", message); break;
  }
}

void set_log_level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: spdlog::set_level(spdlog::level::debug); break;
    case LogLevel::kInfo: spdlog::set_level(spdlog::level::info); break;
    case LogLevel::kWarn: spdlog::set_level(spdlog::level::warn); break;
    case LogLevel::kError: spdlog::set_level(spdlog::level::err); break;
  }
}

void log_to_stderr(LogLevel level) {
  auto logger = spdlog::get("sparsebit");
  if (!logger) logger = spdlog::stderr_color_mt("sparsebit");
  logger->set_pattern("%^%l%$: %v");
  spdlog::set_default_logger(logger);
  set_log_level(level);
}

}  // namespace sparsebit::sdk
