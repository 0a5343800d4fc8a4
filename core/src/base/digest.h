#pragma once
// FNV-1a over 8-byte words: a fast digest of bytes that must match between two reads (a
// checkpoint against what was saved, a rank's job against rank 0's). Not a defence against
// someone forging a collision.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace sparsebit {

struct Digest64 {
  std::uint64_t value = 1469598103934665603ull;
  void mix(const void* data, std::size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes + i, std::min<std::size_t>(8, n - i));
      value = (value ^ word) * 1099511628211ull;
    }
  }
  void mix(const std::string& s) { mix(s.data(), s.size()); }
};

}  // namespace sparsebit
