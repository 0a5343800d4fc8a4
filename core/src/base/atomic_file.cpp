#include "sparsebit/core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
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

/// Appends `s` to the buffer at `*end` (up to `last`); async-signal-safe.
void append(char*& end, const char* last, const char* s) {
  while (*s && end < last) *end++ = *s++;
}

extern "C" void on_interrupt(int sig) {
  remove_temporary_files();
  // One write() of the whole line: the workers of an --nproc run, interrupted together, print
  // one line each rather than their words interleaved (writes up to PIPE_BUF are atomic).
  static char line[sizeof g_what + 128];
  char* end = line;
  const char* last = line + sizeof line - 2;
  append(end, last, "sparsebit: interrupted by ");
  append(end, last, sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
  append(end, last, " while running ");
  append(end, last, g_what);
  append(end, last, "; no output was written\n");
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line, static_cast<std::size_t>(end - line));
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
  std::error_code ec;
  if (path_.empty()) throw Error("cannot write an output with an empty path");
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;  // follows links
  const int stat_error = errno;
  struct stat link {};
  if (::lstat(path_.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    if (!exists)
      throw Error("cannot write " + printable(path_) + ": it is a symbolic link to a file that cannot be reached (" +
                  std::strerror(stat_error) + "); create its target or remove the link");
    if (S_ISREG(st.st_mode)) path_ = fs::canonical(path_, ec).string();  // replace what it names, keep the link
  }
  if (exists && S_ISBLK(st.st_mode))
    throw Error("cannot write " + printable(path_) + ": it is a block device (a disk); write to a file");
  if (exists && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    through_ = true;
    return;
  }
  fs::path target(path_);
  if (fs::is_directory(target, ec)) throw Error("cannot write " + printable(path_) + ": it is a folder");
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) {
    throw Error("cannot write " + printable(path_) + ": folder " + printable(dir.string()) +
                (ec && ec != std::errc::no_such_file_or_directory ? ": " + ec.message()
                                                                  : std::string(" does not exist; create it first")));
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
  if (through_) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error("cannot write " + printable(path_) + ": " + std::strerror(errno));
    return;
  }
  fs::path target(path_);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // At most 64 bytes of the name: a name near the file system's 255-byte limit still has room
  // for the temporary's dot and suffix.
  std::string tmpl = (dir / ("." + target.filename().string().substr(0, 64) + ".tmp-XXXXXX")).string();
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

namespace {

// Note [Files a run read]: (device, inode) -> change time of the version read, while a run lasts.
struct ReadFiles {
  std::mutex mutex;
  int runs = 0;
  std::map<std::pair<dev_t, ino_t>, std::pair<time_t, long>> files;
};
ReadFiles& read_files() {
  static ReadFiles r;
  return r;
}

}  // namespace

FilesReadScope::FilesReadScope() {
  std::lock_guard<std::mutex> lock(read_files().mutex);
  ++read_files().runs;
}

FilesReadScope::~FilesReadScope() {
  std::lock_guard<std::mutex> lock(read_files().mutex);
  if (--read_files().runs == 0) read_files().files.clear();
}

void note_file_read(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  std::lock_guard<std::mutex> lock(read_files().mutex);
  if (read_files().runs > 0) read_files().files[{st.st_dev, st.st_ino}] = {st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

void AtomicFile::commit() {
  if (!through_) {  // Note [Files a run read]
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0) {
      std::lock_guard<std::mutex> lock(read_files().mutex);
      const auto it = read_files().files.find({st.st_dev, st.st_ino});
      if (it != read_files().files.end() && it->second == std::make_pair(st.st_ctim.tv_sec, st.st_ctim.tv_nsec))
        throw Error("cannot write " + printable(path_) +
                    ": this run read that file as input (a model, its external data, a config or a data sample); "
                    "writing it would destroy it, so choose another path");
    }
  }
  if (fd_ < 0) open_temporary();  // an empty file
  if (through_) {
    const bool closed = ::close(fd_) == 0;
    fd_ = -1;
    if (!closed) throw Error("cannot write " + printable(path_) + ": " + std::strerror(errno));
    committed_ = true;
    return;
  }
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

void check_distinct_paths(const std::vector<PathRole>& inputs, const std::vector<PathRole>& outputs) {
  auto identity = [](const std::string& path) -> std::string {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return "";  // a device or FIFO: written through
      return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    }
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
    return "path " + (ec ? path : p.string());
  };
  std::map<std::string, std::string> seen;  // identity -> name
  for (const auto& in : inputs)
    if (!in.path.empty())
      if (std::string id = identity(in.path); !id.empty()) seen.emplace(id, in.name);
  std::set<std::string> input_ids;
  for (const auto& [id, name] : seen) input_ids.insert(id);
  // Input folders (--calib DIR, test-data folders): a file already inside one is a sample.
  std::vector<std::pair<fs::path, std::string>> folders;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (!in.path.empty() && fs::is_directory(in.path, ec))
      folders.emplace_back(fs::weakly_canonical(fs::absolute(in.path, ec), ec), in.name);
  }
  for (const auto& out : outputs) {
    if (out.path.empty() && !out.required) continue;
    if (out.path.empty()) throw Error(out.name + ": the output path is empty");
    const std::string id = identity(out.path);
    if (id.empty()) continue;
    std::error_code ec;
    if (fs::is_regular_file(out.path, ec)) {
      const fs::path file = fs::weakly_canonical(fs::absolute(out.path, ec), ec);
      for (const auto& [folder, name] : folders) {
        const auto [end, rest] = std::mismatch(folder.begin(), folder.end(), file.begin(), file.end());
        if (end == folder.end() && rest != file.end())
          throw Error(out.name + " " + printable(out.path) + " is a file inside " + name + " " +
                      printable(folder.string()) + ", a folder the run reads: writing it would replace an input; " +
                      "choose another path");
      }
    }
    auto [it, fresh] = seen.emplace(id, out.name);
    if (!fresh) {
      throw Error(out.name + " " + printable(out.path) + " is the same file as " + it->second +
                  (input_ids.count(id) ? ", an input: writing it would destroy it" : ", another output") +
                  "; choose another path");
    }
  }
}

}  // namespace sparsebit
