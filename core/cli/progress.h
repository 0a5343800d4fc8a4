#pragma once
// A one-line progress display on stderr, shown only when stderr is a terminal.

#include <chrono>
#include <cstdint>
#include <string>

namespace sparsebit::cli {

class Progress {
 public:
  Progress(std::string label, bool enabled);
  ~Progress();
  /// `note` is printed after the counts (e.g. " loss 0.012").
  void update(std::int64_t done, std::int64_t total, const std::string& note = "");
  void finish();

 private:
  std::string label_;
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace sparsebit::cli
