#pragma once
// The core's one way to log: formatted messages through the SDK's sink (sparsebit/sdk/log.h),
// which an embedding application may set; the formatting is skipped below the level.

#include <spdlog/fmt/fmt.h>

#include <utility>

#include "sparsebit/sdk/log.h"

namespace sparsebit::logs {

template <typename... Args>
void write(sdk::LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (sdk::log_enabled(level)) sdk::log(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  write(sdk::LogLevel::kDebug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  write(sdk::LogLevel::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  write(sdk::LogLevel::kWarn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  write(sdk::LogLevel::kError, format, std::forward<Args>(args)...);
}
inline bool debug_enabled() { return sdk::log_enabled(sdk::LogLevel::kDebug); }

}  // namespace sparsebit::logs
