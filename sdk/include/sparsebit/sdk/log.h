#pragma once
/// \file
/// Logging for plugins and hosts. Plugins never link spdlog themselves: they log through the host,
/// whose verbosity the user sets with -v / --quiet. An application that embeds the library routes
/// every message (its own calls', the core's and each plugin's) with set_log_sink(); the library
/// never replaces spdlog's default logger, which stays the application's.

#include <functional>
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

/// Receives each message at or above the level, with its prefix (set_log_prefix), from any thread.
using LogSink = std::function<void(LogLevel level, const std::string& message)>;
/// Routes every message to `sink` in place of stderr; an empty sink restores stderr.
SPARSEBIT_API void set_log_sink(LogSink sink);
/// The level below which messages are dropped.
SPARSEBIT_API LogLevel log_level();
/// Whether a message of `level` would be delivered: to skip building costly ones.
SPARSEBIT_API bool log_enabled(LogLevel level);
/// Text put before every message, such as "[rank 1] " in a run of several processes.
SPARSEBIT_API void set_log_prefix(const std::string& prefix);

inline void log_debug(const std::string& m) { log(LogLevel::kDebug, m); }
inline void log_info(const std::string& m) { log(LogLevel::kInfo, m); }
inline void log_warn(const std::string& m) { log(LogLevel::kWarn, m); }
inline void log_error(const std::string& m) { log(LogLevel::kError, m); }

}  // namespace sparsebit::sdk
