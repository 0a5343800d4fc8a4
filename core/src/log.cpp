#include "sparsebit/sdk/log.h"

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

}  // namespace sparsebit::sdk
