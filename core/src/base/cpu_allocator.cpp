#include "sparsebit/core/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

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

// The context of every block is its data pointer (LibTorch's raw_allocate requires it), so
// the deleter finds the size in a map of blocks in use.

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  // LibTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(std::size_t n) override { return allocate_block(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(std::size_t n) const override { return allocate_block(n); }
#endif

  c10::DataPtr allocate_block(std::size_t n) const {
    if (n < kMinCached) return fallback_->allocate(n);
    std::size_t size = (n + kPage - 1) / kPage * kPage;
    void* p = take(size);  // may enlarge size to the cached block's
    if (!p) {
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      madvise(p, size, MADV_HUGEPAGE);  // 512 times fewer page faults on first touch, where allowed
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_.emplace(p, size);
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }

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

  bool give_back(void* p) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_use_.find(p);
    if (it == in_use_.end()) return false;
    order_.push_back({p, it->second});
    by_size_.emplace(it->second, std::prev(order_.end()));
    cached_bytes_ += it->second;
    in_use_.erase(it);
    return true;
  }

  c10::Allocator* fallback_;
  mutable std::mutex mutex_;
  mutable std::list<Block> order_;  // free blocks, least recently freed first
  mutable std::multimap<std::size_t, std::list<Block>::iterator> by_size_;
  mutable std::unordered_map<void*, std::size_t> in_use_;
  mutable std::size_t cached_bytes_ = 0, hits_ = 0, misses_ = 0;
};

CachingCpuAllocator* CachingCpuAllocator::instance = nullptr;

}  // namespace

bool install_caching_cpu_allocator() {
  static const bool installed = [] {
    if (kSanitized) return false;
    const char* v = std::getenv("SPARSEBIT_CPU_CACHE");
    if (v && std::string(v) == "0") return false;
    // Never destroyed: tensors freed during static destruction still return their blocks.
    CachingCpuAllocator::instance = new CachingCpuAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(CachingCpuAllocator::instance, /*priority=*/1);
#if defined(__GLIBC__)
    // Small blocks (and oneDNN's scratch buffers) live in the malloc heap: trimming its top on
    // every free and faulting it back on the next batch cost a third of the remaining op time.
    // Setting it fixes the mmap threshold too (glibc stops adapting it): put it at the largest
    // value glibc would adapt to, so that such buffers stay in the heap.
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
    return true;
  }();
  return installed;
}

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
