#pragma once
/// \file
/// Logging for plugins. Plugins never link spdlog themselves: they log through the host, whose
/// verbosity the user sets with -v / --quiet.

#include <string>

#include "sparsebit/sdk/export.h"

namespace sparsebit::sdk {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

SPARSEBIT_API void log(LogLevel level, const std::string& message);
/// Messages below `level` are dropped (the CLI sets this from -v / --quiet).
SPARSEBIT_API void set_log_level(LogLevel level);
/// Sends the messages of the host and of every plugin to stderr as "level: message" (coloured on
/// a terminal), dropping those below `level`. Applications call it once; the CLI does.
SPARSEBIT_API void log_to_stderr(LogLevel level);

inline void log_debug(const std::string& m) { log(LogLevel::kDebug, m); }
inline void log_info(const std::string& m) { log(LogLevel::kInfo, m); }
inline void log_warn(const std::string& m) { log(LogLevel::kWarn, m); }

}  // namespace sparsebit::sdk
