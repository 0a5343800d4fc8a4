#include "sparsebit/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace fs = std::filesystem;

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  fs::path target(path_);
  std::error_code ec;
  if (fs::is_directory(target, ec)) throw Error("cannot write " + path_ + ": it is a folder");
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) {
    throw Error("cannot write " + path_ + ": folder " + dir.string() + " does not exist; create it first");
  }
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = mkstemp(buf.data());
  if (fd_ < 0) {
    throw Error("cannot write " + path_ + ": " + std::strerror(errno) + " (check the folder's permissions)");
  }
  tmp_ = buf.data();
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const std::string& bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + path_ + ": " + std::strerror(errno));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0 || ::close(fd_) != 0) {
    fd_ = -1;
    throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  }
  fd_ = -1;
  ::chmod(tmp_.c_str(), 0644);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  }
  committed_ = true;
}

}  // namespace sparsebit
