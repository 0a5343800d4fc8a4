#include "sparsebit/core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <vector>

#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace fs = std::filesystem;

namespace {

// The live temporaries, in fixed storage a signal handler can read (Note [Interrupted runs]).
constexpr int kSlots = 64;
constexpr std::size_t kPathMax = 4096;
// A slot is free (0), being filled by one thread (1), or holds a live path (2): writers on
// several threads (a checkpoint written while training goes on) never share one.
char g_paths[kSlots][kPathMax];
std::atomic<int> g_state[kSlots];
char g_what[512];

int claim_slot(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int free = 0;
    if (!g_state[i].compare_exchange_strong(free, 1)) continue;
    std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
    g_state[i].store(2);
    return i;
  }
  return -1;  // more writers than slots: still removed by their destructors
}

void release_slot(int slot) {
  if (slot >= 0) g_state[slot].store(0);
}

void write_all(const char* s) {
  for (std::size_t left = std::strlen(s); left > 0;) {
    const ssize_t n = ::write(STDERR_FILENO, s, left);
    if (n <= 0) return;
    s += n;
    left -= static_cast<std::size_t>(n);
  }
}

extern "C" void on_interrupt(int sig) {
  remove_temporary_files();
  write_all("sparsebit: interrupted by ");
  write_all(sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
  write_all(" while running ");
  write_all(g_what);
  write_all("; no output was written\n");
  ::_exit(128 + sig);
}

extern "C" void on_abort(int sig) {
  remove_temporary_files();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

mode_t new_file_mode() {
  const mode_t mask = ::umask(0);  // read it back: there is no other way to query it
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

void remove_temporary_files() noexcept {
  for (int i = 0; i < kSlots; ++i)
    if (g_state[i].load() == 2) ::unlink(g_paths[i]);
}

void install_interrupt_cleanup(const std::string& what) {
  const std::string safe = printable(what, sizeof g_what - 32);
  std::memcpy(g_what, safe.c_str(), std::min(safe.size() + 1, sizeof g_what));
  g_what[sizeof g_what - 1] = '\0';
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_abort;
  ::sigaction(SIGABRT, &sa, nullptr);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  fs::path target(path_);
  std::error_code ec;
  if (path_.empty()) throw Error("cannot write an output with an empty path");
  if (fs::is_directory(target, ec)) throw Error("cannot write " + printable(path_) + ": it is a folder");
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) {
    throw Error("cannot write " + printable(path_) + ": folder " + printable(dir.string()) +
                " does not exist; create it first");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error("cannot write " + printable(path_) + ": " + std::strerror(errno) + " (check the folder's permissions)");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  release_slot(slot_);
}

void AtomicFile::open_temporary() {
  fs::path target(path_);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = mkstemp(buf.data());
  if (fd_ < 0) {
    throw Error("cannot write " + printable(path_) + ": " + std::strerror(errno) + " (check the folder's permissions)");
  }
  tmp_ = buf.data();
  slot_ = claim_slot(tmp_);
}

void AtomicFile::write(const std::string& bytes) {
  if (fd_ < 0) open_temporary();
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + printable(path_) + ": " + std::strerror(errno));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) open_temporary();  // an empty file
  struct stat existing {};
  const mode_t mode = ::stat(path_.c_str(), &existing) == 0 ? (existing.st_mode & 07777) : new_file_mode();
  const bool written = ::fchmod(fd_, mode) == 0 && ::fsync(fd_) == 0;
  const int error = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!written || !closed)
    throw Error("cannot write " + printable(path_) + ": " + std::strerror(written ? errno : error));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    throw Error("cannot write " + printable(path_) + ": " + std::strerror(errno));
  }
  committed_ = true;
  release_slot(slot_);
  slot_ = -1;
}

}  // namespace sparsebit
