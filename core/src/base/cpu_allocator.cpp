#include "sparsebit/core/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "base/limits.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr std::size_t kMinCached = std::size_t{1} << 20;
constexpr std::size_t kPage = 4096;

struct Block {
  void* ptr;
  std::size_t size;
};

struct InUse {
  std::size_t size;
  bool mapped;  // ours (cached on free), or the fallback's (handed back to it)
};

// The context of every block is its data pointer (LibTorch's raw_allocate requires it), so
// the deleter finds the size in a map of blocks in use.

class CachingCpuAllocator final : public c10::Allocator {
 public:
  CachingCpuAllocator(c10::Allocator* fallback, bool caching) : fallback_(fallback), caching_(caching) {}

  // LibTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(std::size_t n) override { return allocate_block(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(std::size_t n) const override { return allocate_block(n); }
#endif

  c10::DataPtr allocate_block(std::size_t n) const {
    if (n < kMinCached) return fallback_->allocate(n);
    if (n > std::numeric_limits<std::size_t>::max() - kPage) throw MemoryLimitExceeded(n, in_use_bytes(), limit());
    std::size_t size = (n + kPage - 1) / kPage * kPage;
    reserve(size);
    void* p = nullptr;
    if (!caching_) {
      try {
        p = fallback_->raw_allocate(size);
      } catch (...) {
        unreserve(size);
        throw;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_.emplace(p, InUse{size, false});
      return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
    }
    const std::size_t reserved = size;
    p = take(size);  // may enlarge size to the cached block's
    if (!p) {
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        unreserve(size);
        throw std::bad_alloc();
      }
      madvise(p, size, MADV_HUGEPAGE);  // 512 times fewer page faults on first touch, where allowed
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ += size - reserved;  // a cached block larger than asked for
      in_use_.emplace(p, InUse{size, true});
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }

  std::size_t in_use_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_use_bytes_;
  }
  std::size_t limit() const { return limit_.load(); }
  void set_limit(std::size_t bytes) { limit_.store(bytes); }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void release_cached() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Block& b : order_) munmap(b.ptr, b.size);
    order_.clear();
    by_size_.clear();
    cached_bytes_ = 0;
  }

  CpuCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {cached_bytes_, hits_, misses_};
  }

  static CachingCpuAllocator* instance;

 private:
  // Counts `size` as in use, or refuses it before anything is allocated (Note [Memory limit]).
  void reserve(std::size_t size) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t cap = limit_.load();
    if (size > cap || in_use_bytes_ > cap - size) throw MemoryLimitExceeded(size, in_use_bytes_, cap);
    in_use_bytes_ += size;
  }
  void unreserve(std::size_t size) const {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_bytes_ -= size;
  }

  // Also raw_deallocate's deleter, for the fallback's small blocks too.
  static void release(void* p) {
    if (!instance->give_back(p)) instance->fallback_->raw_deleter()(p);
  }

  // A cached block of at least `size` (which becomes the block's size), or null after making
  // room for a new one.
  void* take(std::size_t& size) const {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest cached block that fits, unless it is more than half as large again: a
    // long-lived tensor in a block far larger than itself (the codes of an exported weight in
    // a block freed by a float activation) would hold the difference until the end.
    auto it = by_size_.lower_bound(size);
    if (it != by_size_.end() && it->first - size <= size / 2) {
      void* p = it->second->ptr;
      size = it->first;
      cached_bytes_ -= size;
      order_.erase(it->second);
      by_size_.erase(it);
      ++hits_;
      return p;
    }
    ++misses_;
    std::size_t freed = 0;
    while (freed < size && !order_.empty()) {  // least recently freed first
      const Block b = order_.front();
      auto range = by_size_.equal_range(b.size);
      for (auto r = range.first; r != range.second; ++r)
        if (r->second == order_.begin()) {
          by_size_.erase(r);
          break;
        }
      order_.pop_front();
      munmap(b.ptr, b.size);
      cached_bytes_ -= b.size;
      freed += b.size;
    }
    return nullptr;
  }

  // False for a block the fallback allocated: its deleter frees it.
  bool give_back(void* p) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_use_.find(p);
    if (it == in_use_.end()) return false;
    const InUse block = it->second;
    in_use_.erase(it);
    in_use_bytes_ -= block.size;
    if (!block.mapped) return false;
    order_.push_back({p, block.size});
    by_size_.emplace(block.size, std::prev(order_.end()));
    cached_bytes_ += block.size;
    return true;
  }

  c10::Allocator* fallback_;
  const bool caching_;
  std::atomic<std::size_t> limit_{default_memory_limit()};
  mutable std::mutex mutex_;
  mutable std::list<Block> order_;  // free blocks, least recently freed first
  mutable std::multimap<std::size_t, std::list<Block>::iterator> by_size_;
  mutable std::unordered_map<void*, InUse> in_use_;
  mutable std::size_t in_use_bytes_ = 0, cached_bytes_ = 0, hits_ = 0, misses_ = 0;
};

CachingCpuAllocator* CachingCpuAllocator::instance = nullptr;

}  // namespace

namespace {
CachingCpuAllocator* install(bool caching) {
  // Never destroyed: tensors freed during static destruction still return their blocks.
  CachingCpuAllocator::instance = new CachingCpuAllocator(c10::GetDefaultCPUAllocator(), caching);
  c10::SetCPUAllocator(CachingCpuAllocator::instance, /*priority=*/1);
  return CachingCpuAllocator::instance;
}
std::mutex install_mutex;
}  // namespace

bool install_caching_cpu_allocator() {
  std::lock_guard<std::mutex> lock(install_mutex);
  static const bool installed = [] {
    const char* v = std::getenv("SPARSEBIT_CPU_CACHE");
    const bool caching = !kSanitized && !(v && std::string(v) == "0");
    if (CachingCpuAllocator::instance) return false;  // the limit alone came first
    install(caching);
#if defined(__GLIBC__)
    // Small blocks (and oneDNN's scratch buffers) live in the malloc heap: trimming its top on
    // every free and faulting it back on the next batch cost a third of the remaining op time.
    // Setting it fixes the mmap threshold too (glibc stops adapting it): put it at the largest
    // value glibc would adapt to, so that such buffers stay in the heap.
    if (caching) {
      mallopt(M_TRIM_THRESHOLD, 1 << 30);
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
    }
#endif
    return caching;
  }();
  return installed;
}

void install_memory_limit() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (!CachingCpuAllocator::instance) install(false);
}

namespace {
std::size_t cgroup_memory_max() {
  // cgroup v2, then v1: a container's limit is below the host's memory that sysconf reports.
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    unsigned long long v = 0;
    if (f >> v && v > 0) return static_cast<std::size_t>(v);
  }
  return std::numeric_limits<std::size_t>::max();
}
}  // namespace

std::size_t default_memory_limit() {
  const std::uint64_t machine = std::min<std::uint64_t>(limits::physical_memory(), cgroup_memory_max());
  return static_cast<std::size_t>(machine / 10 * 9);
}

void set_memory_limit(std::size_t bytes) {
  install_memory_limit();
  CachingCpuAllocator::instance->set_limit(bytes == 0 ? default_memory_limit() : bytes);
}

std::size_t memory_limit() { return CachingCpuAllocator::instance ? CachingCpuAllocator::instance->limit() : 0; }

std::size_t parse_memory_size(const std::string& text, const std::string& what) {
  std::size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  const std::string number = text.substr(0, digits), unit = text.substr(digits);
  static const std::map<std::string, double> units = {{"", 1.0},
                                                      {"B", 1.0},
                                                      {"K", 1024.0},
                                                      {"KB", 1e3},
                                                      {"KiB", 1024.0},
                                                      {"M", 1048576.0},
                                                      {"MB", 1e6},
                                                      {"MiB", 1048576.0},
                                                      {"G", 1073741824.0},
                                                      {"GB", 1e9},
                                                      {"GiB", 1073741824.0},
                                                      {"T", 1099511627776.0},
                                                      {"TB", 1e12},
                                                      {"TiB", 1099511627776.0},
                                                      {"%", 0.0}};
  const auto u = units.find(unit);
  char* end = nullptr;
  const double x = number.empty() ? -1.0 : std::strtod(number.c_str(), &end);
  if (u == units.end() || number.empty() || *end || !(x > 0.0))
    throw Error(what + ": '" + printable(text, 40) +
                "' is not a memory size; write bytes or a number with KiB, MiB, GiB, TiB (or KB, MB, GB, TB), or "
                "a share of this machine's memory such as 80%");
  const double machine = static_cast<double>(std::min<std::uint64_t>(limits::physical_memory(), cgroup_memory_max()));
  if (unit == "%" && x > 100.0) throw Error(what + ": " + printable(text, 40) + " is more than all of the memory");
  const double bytes = unit == "%" ? machine * x / 100.0 : x * u->second;
  if (bytes < static_cast<double>(kMinCached))
    throw Error(what + ": " + printable(text, 40) + " is less than 1 MiB; no run fits in it");
  if (bytes >= 1.8e19) throw Error(what + ": " + printable(text, 40) + " is beyond any machine");
  return static_cast<std::size_t>(bytes);
}

std::string memory_size_text(std::size_t bytes) {
  char buf[64];
  if (bytes >= (std::size_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / 1073741824.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

MemoryLimitExceeded::MemoryLimitExceeded(std::size_t requested, std::size_t in_use, std::size_t limit)
    : requested_(requested),
      in_use_(in_use),
      limit_(limit),
      message_("a tensor of " + memory_size_text(requested) + " with " + memory_size_text(in_use) +
               " already in use would pass the memory limit of " + memory_size_text(limit) +
               " (--memory-limit; by default 90% of this machine's memory)") {}

void release_free_memory() {
  if (CachingCpuAllocator::instance) CachingCpuAllocator::instance->release_cached();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

CpuCacheStats caching_cpu_allocator_stats() {
  return CachingCpuAllocator::instance ? CachingCpuAllocator::instance->stats() : CpuCacheStats{};
}

}  // namespace sparsebit
