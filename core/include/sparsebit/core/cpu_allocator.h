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

#include <cstddef>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// Makes the caching allocator LibTorch's CPU allocator (Note [Caching CPU allocator]).
/// Idempotent. Does nothing under AddressSanitizer (reuse would hide use-after-free) or when
/// SPARSEBIT_CPU_CACHE=0 is set. Returns whether it is installed.
SPARSEBIT_API bool install_caching_cpu_allocator();

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
