#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace sparsebit::cli {

Progress::Progress(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled && isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::update(std::int64_t done, std::int64_t total, const std::string& note) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (shown_ && now - last_ < std::chrono::milliseconds(100) && done != total) return;
  last_ = now;
  shown_ = true;
  const double secs = std::chrono::duration<double>(now - start_).count();
  if (total > 0) {
    const int width = 30;
    const int filled = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld (%.1fs)%s", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), static_cast<long long>(done), static_cast<long long>(total),
                 secs, note.c_str());
  } else {
    std::fprintf(stderr, "\r%s %lld (%.1fs)%s", label_.c_str(), static_cast<long long>(done), secs, note.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && shown_) std::fputc('\n', stderr);
  shown_ = false;
}

}  // namespace sparsebit::cli
