#pragma once
// Node-name and plugin-name globs (config `skip`, `[[specific]] nodes`, `[plugins] enable`).

#include <fnmatch.h>

#include <algorithm>
#include <string>
#include <vector>

namespace sparsebit {

/// Why `glob` is not a valid pattern (a '[' never closed, a trailing '\\'), or empty if it is.
inline std::string glob_error(const std::string& glob) {
  for (std::size_t i = 0; i < glob.size(); ++i) {
    if (glob[i] == '\\') {
      if (++i == glob.size()) return "it ends with an escaping '\\'";
    } else if (glob[i] == '[') {
      std::size_t j = i + 1;
      if (j < glob.size() && (glob[j] == '!' || glob[j] == '^')) ++j;
      if (j < glob.size() && glob[j] == ']') ++j;  // a leading ']' is a member
      while (j < glob.size() && glob[j] != ']') ++j;
      if (j == glob.size()) return "its '[' at position " + std::to_string(i) + " is never closed by ']'";
      i = j;
    }
  }
  return {};
}

inline bool matches_any(const std::string& name, const std::vector<std::string>& globs) {
  return std::any_of(globs.begin(), globs.end(),
                     [&](const std::string& g) { return fnmatch(g.c_str(), name.c_str(), 0) == 0; });
}

}  // namespace sparsebit
