#include "sparsebit/sdk/options.h"

#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace {
[[noreturn]] void wrong_type(const Options& o, const std::string& key, const char* wanted) {
  throw Error(o.where() + ": key '" + key + "' must be " + wanted);
}
}  // namespace

double Options::get_double(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_.insert(key);
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  if (auto* i = std::get_if<std::int64_t>(&it->second)) return double(*i);
  wrong_type(*this, key, "a number");
}

std::int64_t Options::get_int(const std::string& key, std::int64_t fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_.insert(key);
  if (auto* i = std::get_if<std::int64_t>(&it->second)) return *i;
  wrong_type(*this, key, "an integer");
}

bool Options::get_bool(const std::string& key, bool fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_.insert(key);
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  wrong_type(*this, key, "true or false");
}

std::string Options::get_string(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_.insert(key);
  if (auto* s = std::get_if<std::string>(&it->second)) return *s;
  wrong_type(*this, key, "a string");
}

std::vector<std::string> Options::unused() const {
  std::vector<std::string> out;
  for (auto& kv : values_)
    if (!used_.count(kv.first)) out.push_back(kv.first);
  return out;
}

}  // namespace sparsebit
