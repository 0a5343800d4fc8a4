#pragma once
/// \file
/// A caching allocator for large CPU tensors.
///
/// Note [Caching CPU allocator]
/// Calibration allocates the same activation sizes batch after batch. Through LibTorch's
/// default allocator every block over glibc's mmap threshold (32 MiB at most) is a fresh mmap:
/// the kernel zeroes each page on first touch and unmaps it on free, and smaller blocks live
/// in a heap that glibc trims on free and regrows on the next batch; in a MobileNetV2
/// calibration that was most of the op time (2.28 s of ops, 0.7-1.0 s without it). Raising
/// glibc's thresholds alone kept freed activations in the heap, where fragmentation raised peak
/// RSS by half. So this allocator keeps freed blocks of 1 MiB and more and hands a request the
/// smallest cached block that fits it, unless that block is more than 1.5 times the request
/// (a long-lived tensor would otherwise hold the rest of a far larger block: exported 4-bit
/// codes took 476 MiB of blocks for 96 MiB of data). A request no cached block fits first unmaps cached
/// blocks worth at least its own size (least recently freed first), so memory held never rises
/// above the blocks in use at their peak plus one block: steady batches reuse their blocks, and
/// a change of shapes recycles the memory. Smaller blocks go to LibTorch's default allocator,
/// in a heap no longer trimmed on every free (mallopt, glibc only).
///
/// It is process-wide (LibTorch has one CPU allocator), so the library never installs it on its
/// own: the `sparsebit` command and the benchmarks do; an embedding program may.
///
/// Note [Memory limit]
/// Sizes that a model computes at run time (ConstantOfShape's shape input, Expand, Tile, Pad,
/// Resize scales, OneHot's depth, a convolution's pads) are not known when it is loaded, and a
/// 1 KB model can ask for terabytes. Where the request is below the system's overcommit limit,
/// the allocation succeeds and the pages fill until the kernel kills a process, perhaps another
/// one. So every CPU block of 1 MiB and more goes through this allocator, which counts the bytes
/// in use and refuses a block that would take them past the limit before anything is allocated
/// (MemoryLimitExceeded); the executor adds the node and its input shapes to the message. Smaller
/// blocks are not counted: each is harmless, and counting them would cost every small tensor a
/// lock. The limit defaults to 90% of the machine's memory (or of a container's cgroup limit)
/// and is set by `--memory-limit` or `set_memory_limit`. GPU memory is not counted (CUDA's own
/// allocator refuses what the device lacks). The limit works with or without the cache.

#include <cstddef>
#include <new>
#include <string>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// Makes the caching allocator LibTorch's CPU allocator (Note [Caching CPU allocator]).
/// Idempotent. It caches nothing under AddressSanitizer (reuse would hide use-after-free), when
/// SPARSEBIT_CPU_CACHE=0 is set or after install_memory_limit(), and only counts against the
/// memory limit then. Returns whether it caches.
SPARSEBIT_API bool install_caching_cpu_allocator();

/// Puts the memory limit's counting allocator in place without the cache (for hosts that
/// must keep LibTorch's allocation behaviour, such as the Python module). Idempotent.
SPARSEBIT_API void install_memory_limit();

/// Sets the limit on CPU bytes in use (Note [Memory limit]); 0 restores the default. Installs
/// the counting allocator first if no allocator of ours is installed.
SPARSEBIT_API void set_memory_limit(std::size_t bytes);
/// The limit in force; 0 when no allocator of ours is installed (nothing is counted).
SPARSEBIT_API std::size_t memory_limit();
/// 90% of this machine's memory, or of the container's limit where that is lower.
SPARSEBIT_API std::size_t default_memory_limit();
/// "8GiB", "512MiB", "2GB", "1073741824", "80%" (of this machine's memory); throws an Error
/// that starts with `what` for anything else.
SPARSEBIT_API std::size_t parse_memory_size(const std::string& text, const std::string& what);
/// "1.5 GiB", "12.0 MiB".
SPARSEBIT_API std::string memory_size_text(std::size_t bytes);

/// A block refused by the memory limit. A bad_alloc, so that code which handles running out of
/// memory handles it; the message says how much was asked for, what was in use and the limit.
class SPARSEBIT_API MemoryLimitExceeded : public std::bad_alloc {
 public:
  MemoryLimitExceeded(std::size_t requested, std::size_t in_use, std::size_t limit);
  const char* what() const noexcept override { return message_.c_str(); }
  std::size_t requested() const { return requested_; }
  std::size_t in_use() const { return in_use_; }
  std::size_t limit() const { return limit_; }

 private:
  std::size_t requested_, in_use_, limit_;
  std::string message_;
};

/// Bytes held in cached (free) blocks now, and the number of requests served from the cache
/// and by a fresh mapping since installation.
struct CpuCacheStats {
  std::size_t cached_bytes = 0;
  std::size_t hits = 0, misses = 0;
};
SPARSEBIT_API CpuCacheStats caching_cpu_allocator_stats();

/// Returns memory nobody uses to the system: the caching allocator's free blocks and the free
/// pages of the malloc heap (which the raised trim threshold keeps otherwise). Called between
/// phases whose allocations differ (after loading a model, before exporting), so that the peak
/// of one phase is not carried into the next.
SPARSEBIT_API void release_free_memory();

}  // namespace sparsebit
