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

}  // namespace sparsebit
