#pragma once
// Shared by the libFuzzer targets: every input must end either in a result or in a
// sparsebit::Error (a clear message). Anything else escaping (another exception type, a crash,
// a sanitizer report, a huge allocation) is a finding.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit::fuzz {

/// A per-process scratch file for readers that take a path.
inline const std::string& scratch_file(const char* suffix) {
  static const std::string path = "/tmp/sparsebit_fuzz_" + std::to_string(getpid()) + suffix;
  return path;
}

inline std::string write_scratch(const std::uint8_t* data, std::size_t size, const char* suffix) {
  const std::string& path = scratch_file(suffix);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

inline void quiet() {
  static const bool once = (sdk::set_log_level(sdk::LogLevel::kError), true);
  (void)once;
}

}  // namespace sparsebit::fuzz
