#pragma once
// Node-name and plugin-name globs (config `skip`, `[[specific]] nodes`, `[plugins] enable`), and
// the torch module path a node name carries (module_path_of, config.h), which node globs match.

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"

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

/// Whether a glob of `skip` or `[[specific]] nodes` names the node: by its ONNX name, by the
/// torch module path it came from (`backbone*`, `head.fc`), or by that path as torch.fx spells
/// node names, dots as underscores (`layer1_0_conv1`), which the original toolkit's configs use.
inline bool node_matches_any(const std::string& node_name, const std::vector<std::string>& globs) {
  if (matches_any(node_name, globs)) return true;
  std::string module = module_path_of(node_name);
  if (module.empty()) return false;
  if (matches_any(module, globs)) return true;
  std::replace(module.begin(), module.end(), '.', '_');
  return matches_any(module, globs);
}

}  // namespace sparsebit
