#include "sparsebit/sdk/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace sparsebit::sdk {
namespace {

// The library's own spdlog logger for stderr, registered as "sparsebit" (where the host wraps its
// sinks, escape_log_messages) and never made the default: an application that embeds the library
// keeps spdlog's default logger as it set it.
struct LogState {
  LogState() {
    stderr_logger = spdlog::get("sparsebit");
    if (!stderr_logger) stderr_logger = spdlog::stderr_color_mt("sparsebit");
    stderr_logger->set_level(spdlog::level::trace);  // `level` decides
    stderr_logger->set_pattern("%^%l%$: %v");
  }
  std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
  std::mutex mutex;
  LogSink sink;  // the application's; empty: stderr
  std::string prefix;
  std::shared_ptr<spdlog::logger> stderr_logger;
};

LogState& state() {
  static LogState s;
  return s;
}

spdlog::level::level_enum spdlog_level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: break;
  }
  return spdlog::level::err;
}

}  // namespace

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= state().level.load(std::memory_order_relaxed); }

LogLevel log_level() { return static_cast<LogLevel>(state().level.load(std::memory_order_relaxed)); }

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  auto& s = state();
  LogSink sink;
  std::string prefix;
  {
    std::lock_guard lock(s.mutex);
    if (!s.sink) {
      s.stderr_logger->log(spdlog_level(level), message);
      return;
    }
    sink = s.sink;
    prefix = s.prefix;
  }
  sink(level, prefix + message);  // outside the lock: a sink may log itself
}

void set_log_level(LogLevel level) { state().level.store(static_cast<int>(level), std::memory_order_relaxed); }

void log_to_stderr(LogLevel level) {
  set_log_sink(nullptr);
  set_log_level(level);
}

void set_log_sink(LogSink sink) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.sink = std::move(sink);
}

void set_log_prefix(const std::string& prefix) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.prefix = prefix;
  s.stderr_logger->set_pattern(prefix + "%^%l%$: %v");
}

}  // namespace sparsebit::sdk
