#include "base/mapped_file.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <string>

namespace sparsebit {
namespace {

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21  // Linux 5.4
#endif

/// One file's mapping, shared by the tensors on it; its address range is registered so that
/// page_out() can tell a mapped tensor from a heap one.
class Mapping {
 public:
  Mapping(void* base, std::size_t size) : base_(base), size_(size) {
    std::lock_guard<std::mutex> lock(mutex());
    ranges()[address()] = address() + size_;
  }
  ~Mapping() {
    {
      std::lock_guard<std::mutex> lock(mutex());
      ranges().erase(address());
    }
    munmap(base_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return static_cast<char*>(base_); }
  std::size_t size() const { return size_; }

  static bool contains(std::uintptr_t begin, std::uintptr_t end) {
    std::lock_guard<std::mutex> lock(mutex());
    auto it = ranges().upper_bound(begin);
    if (it == ranges().begin()) return false;
    --it;
    return begin >= it->first && end <= it->second;
  }

 private:
  std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(base_); }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::uintptr_t, std::uintptr_t>& ranges() {
    static std::map<std::uintptr_t, std::uintptr_t> r;
    return r;
  }
  void* base_;
  std::size_t size_;
};

/// The mapping of `file` as last opened (same size and modification time), so the tensors of
/// one data file share one mapping while any of them lives.
std::shared_ptr<Mapping> mapping_of(const std::filesystem::path& file) {
  static std::mutex m;
  static std::map<std::string, std::weak_ptr<Mapping>> open;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return nullptr;
  }
  const std::string key = file.string() + "|" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + "|" +
                          std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
                          std::to_string(st.st_mtim.tv_nsec);
  std::lock_guard<std::mutex> lock(m);
  if (auto shared = open[key].lock()) {
    ::close(fd);
    return shared;
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) return nullptr;
  auto shared = std::make_shared<Mapping>(base, size);
  open[key] = shared;
  return shared;
}

}  // namespace

at::Tensor map_tensor(const std::filesystem::path& file, std::int64_t offset, at::IntArrayRef shape,
                      at::ScalarType dtype) {
  if (offset < 0 || offset % static_cast<std::int64_t>(c10::elementSize(dtype)) != 0) return {};
  auto mapping = mapping_of(file);
  if (!mapping) return {};
  std::int64_t nbytes = static_cast<std::int64_t>(c10::elementSize(dtype));
  for (auto d : shape) nbytes *= d;
  if (static_cast<std::size_t>(offset + nbytes) > mapping->size()) return {};
  return at::from_blob(
      mapping->data() + offset, shape, [mapping](void*) mutable { mapping.reset(); }, at::TensorOptions().dtype(dtype));
}

at::Tensor spill(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.is_sparse() || is_mapped(t)) return t;
  const at::Tensor c = t.contiguous();
  const auto nbytes = static_cast<std::size_t>(c.nbytes());
  if (nbytes == 0) return t;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (ec) return t;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {  // a file system without O_TMPFILE: a named file, unlinked at once
    std::string name = (dir / "sparsebit-spill-XXXXXX").string();
    fd = mkstemp(name.data());
    if (fd < 0) return t;
    ::unlink(name.c_str());
  }
  const char* p = static_cast<const char*>(c.data_ptr());
  for (std::size_t done = 0; done < nbytes;) {
    const ssize_t n = ::write(fd, p + done, nbytes - done);
    if (n <= 0) {
      ::close(fd);
      return t;
    }
    done += static_cast<std::size_t>(n);
  }
  void* base = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) return t;
  auto mapping = std::make_shared<Mapping>(base, nbytes);
  return at::from_blob(
      mapping->data(), c.sizes(), [mapping](void*) mutable { mapping.reset(); }, c.options());
}

bool is_mapped(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.device().is_cpu()) return false;
  const auto begin = reinterpret_cast<std::uintptr_t>(t.storage().data());
  const auto end = begin + t.storage().nbytes();
  return end > begin && Mapping::contains(begin, end);
}

void page_out(const at::Tensor& t) {
  if (!is_mapped(t)) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(t.storage().data());
  const auto end = begin + t.storage().nbytes();
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_PAGEOUT);  // a hint: errors ignored
}

}  // namespace sparsebit
