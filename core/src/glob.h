#pragma once
// Node-name and plugin-name globs (config `skip`, `[[specific]] nodes`, `[plugins] enable`).

#include <fnmatch.h>

#include <algorithm>
#include <string>
#include <vector>

namespace sparsebit {

inline bool matches_any(const std::string& name, const std::vector<std::string>& globs) {
  return std::any_of(globs.begin(), globs.end(),
                     [&](const std::string& g) { return fnmatch(g.c_str(), name.c_str(), 0) == 0; });
}

}  // namespace sparsebit
