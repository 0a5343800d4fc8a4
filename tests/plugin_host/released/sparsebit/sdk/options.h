#pragma once
/// \file
/// Options a user sets for a plugin object in the config (for example `[w.observer_options]`).
/// A plugin reads what it understands; the host then refuses any key nobody read, naming it,
/// so a typo never silently falls back to a default.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

class SPARSEBIT_API Options {
 public:
  using Value = std::variant<bool, std::int64_t, double, std::string>;

  Options() = default;
  /// `where` names the config table for messages, e.g. "[w.observer_options]".
  explicit Options(std::string where) : where_(std::move(where)) {}

  void set(const std::string& key, Value v) { values_[key] = std::move(v); }
  bool has(const std::string& key) const { return values_.count(key) != 0; }

  double get_double(const std::string& key, double fallback) const;
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  /// Keys set but never read by anyone.
  std::vector<std::string> unused() const;
  const std::string& where() const { return where_; }
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  std::string where_;
  std::map<std::string, Value> values_;
  mutable std::set<std::string> used_;
};

}  // namespace sparsebit
