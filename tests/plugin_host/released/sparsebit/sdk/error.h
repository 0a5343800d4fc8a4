#pragma once
/// \file
/// The one exception type users see. Messages say what went wrong, where (file, node, op,
/// plugin, config key) and what to do next; callers add context by wrapping, never by
/// swallowing.

#include <stdexcept>
#include <string>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

class SPARSEBIT_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// `text` made safe to quote in a message: control characters escaped (\n, \t, \x1b, ...) and
/// anything past `max` characters cut, with the full length said, so untrusted strings (config
/// values, node, op and file names, attribute strings) can neither flood a log nor steer the
/// terminal or split the one-line message.
inline std::string printable(const std::string& text, std::size_t max = 200) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  const std::size_t n = text.size() > max ? max : text.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    else out += static_cast<char>(c);
  }
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " characters)";
  return out;
}

}  // namespace sparsebit
