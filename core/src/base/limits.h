#pragma once
// Size checks for untrusted files (models, calibration data): a declared shape is checked for
// negative dims, overflow and a byte size beyond this machine's memory before anything is
// allocated for it, so a tiny file cannot make us allocate terabytes.

#include <unistd.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "sparsebit/sdk/error.h"

namespace sparsebit::limits {

inline std::uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                               : std::numeric_limits<std::uint64_t>::max();
}

/// Elements of a tensor of `shape` with `elem_size`-byte elements; throws naming `what`.
inline std::int64_t checked_numel(const std::vector<std::int64_t>& shape, std::size_t elem_size,
                                  const std::string& what) {
  std::uint64_t n = 1, strides = 1;  // strides: the product without zero dims (LibTorch computes it too)
  bool overflow = false;
  for (auto d : shape) {
    if (d < 0) throw Error(what + " has a negative dimension (" + std::to_string(d) + ")");
    const auto u = static_cast<std::uint64_t>(std::max<std::int64_t>(d, 1));
    if (strides > (std::uint64_t{1} << 62) / u) overflow = true;
    else strides *= u;
    n = d == 0 ? 0 : n * static_cast<std::uint64_t>(d);
  }
  if (overflow) throw Error(what + ": its declared shape overflows a 64-bit size; the file is corrupt");
  const std::uint64_t cap = std::numeric_limits<std::int64_t>::max() / std::max<std::size_t>(elem_size, 1);
  if (overflow || n > cap) throw Error(what + ": its declared shape overflows a 64-bit size; the file is corrupt");
  if (n * std::max<std::size_t>(elem_size, 1) > physical_memory()) {
    throw Error(what + ": its declared shape needs " + std::to_string(n * elem_size) +
                " bytes, more than this machine's memory; the file is corrupt or the tensor too large");
  }
  return static_cast<std::int64_t>(n);
}

/// Parses a non-negative integer field (external-data offsets and lengths).
inline std::int64_t parse_size(const std::string& text, const std::string& what) {
  const std::string shown = printable(text, 40);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(what + ": '" + shown + "' is not a non-negative integer");
  // Up to 18 digits always fits; longer is refused as the size it claims, not as a bad number.
  if (text.size() > 18) throw Error(what + ": " + shown + " bytes is beyond any file (the model is corrupt)");
  return std::stoll(text);
}

}  // namespace sparsebit::limits
