#pragma once
// Timing models in ONNX Runtime through the node helper (Note [Latency step] in latency.cpp), for
// the latency step and the latency search (latency_search.cpp).

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/log.h"
#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit::steps {

/// Where ONNX Runtime and the helper are, or why they cannot be used.
struct Runtime {
  std::string folder, helper, why_not;
};

Runtime find_timer(const LatencyConfig& config);

/// The size of a file, 0 where it cannot be read.
std::int64_t file_bytes(const std::string& path);

/// A fresh temporary folder, removed with everything in it when this goes.
class Scratch {
 public:
  Scratch() {
    static int made = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("sparsebit_latency_" + std::to_string(::getpid()) + "_" + std::to_string(made++));
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  /// Writes `bytes` to a file of this folder and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string path = file(name);
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw Error("[latency]: could not write a temporary model to " + path);
    return path;
  }

 private:
  std::filesystem::path dir_;
};

/// Drops messages below errors while it lives: the candidates' exports would repeat what the
/// export itself says.
class QuietLogs {
 public:
  QuietLogs() : was_(sdk::log_level()) { sdk::set_log_level(std::max(was_, sdk::LogLevel::kError)); }
  ~QuietLogs() { sdk::set_log_level(was_); }
  QuietLogs(const QuietLogs&) = delete;
  QuietLogs& operator=(const QuietLogs&) = delete;

 private:
  sdk::LogLevel was_;
};

/// One thread count's times: the median per model and the rounds each beat the second model.
struct ThreadTimes {
  std::int64_t threads = 0;
  std::vector<double> ms;
  std::vector<std::int64_t> beats_second;
};

/// Times `models` in ONNX Runtime through the helper on the first sample of `calib`; empty with
/// `failure` set where the runtime could not.
std::vector<ThreadTimes> time_models(const LatencyConfig& config, const Runtime& runtime,
                                     const std::vector<std::string>& models, const Graph& graph,
                                     const DataSource& calib, std::string& failure);

}  // namespace sparsebit::steps
