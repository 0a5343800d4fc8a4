#pragma once
// Reading Sparsebit's TOML tables: typed values with the table and key named in every error,
// unknown keys refused with the nearest valid one (config.cpp).

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "base/glob.h"
#include "sparsebit/core/config.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::config_detail {

struct Reader {
  const std::string& source;

  std::string where(const std::string& table) const { return source + (table.empty() ? "" : ": [" + table + "]"); }

  void check_keys(const toml::table& t, const std::string& table, const std::vector<std::string>& allowed) const {
    for (const auto& [k, v] : t) {
      std::string key(k.str());
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string hint = nearest(key, allowed);
      std::string valid;
      for (auto& a : allowed) valid += (valid.empty() ? "" : ", ") + a;
      throw Error(where(table) + ": unknown key '" + printable(key) + "'" +
                  (hint.empty() ? "" : "; did you mean '" + hint + "'?") + " (valid keys: " + valid + ")");
    }
  }

  std::string key_path(const std::string& table, const std::string& key) const {
    return source + ": " + (table.empty() ? key : table + "." + key);
  }

  template <class T>
  T get(const toml::table& t, const std::string& table, const std::string& key, T fallback, const char* what) const {
    const toml::node* n = t.get(key);
    if (!n) return fallback;
    // The kind is checked before converting: toml++ turns a huge float into an integer with
    // undefined behaviour (found by fuzzing: bits = 5.5e103).
    bool kind_ok = n->is_floating_point() || n->is_integer();
    if constexpr (std::is_same_v<T, std::int64_t>) kind_ok = n->is_integer();
    if constexpr (std::is_same_v<T, bool>) kind_ok = n->is_boolean();
    if constexpr (std::is_same_v<T, std::string>) kind_ok = n->is_string();
    std::optional<T> v;
    if (kind_ok) v = n->value<T>();
    if (!v) throw Error(key_path(table, key) + " must be " + what);
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(*v)) throw Error(key_path(table, key) + " must be a finite number, not " + std::to_string(*v));
    }
    return *v;
  }

  /// A list of node- or plugin-name globs: strings(), each checked to be a valid pattern.
  std::vector<std::string> globs(const toml::table& t, const std::string& table, const std::string& key) const {
    auto out = strings(t, table, key);
    for (const auto& g : out) check_glob(g, table, key);
    return out;
  }
  void check_glob(const std::string& g, const std::string& table, const std::string& key) const {
    if (auto why = glob_error(g); !why.empty())
      throw Error(key_path(table, key) + ": '" + printable(g, 80) + "' is not a valid glob: " + why);
  }

  std::vector<std::string> strings(const toml::table& t, const std::string& table, const std::string& key) const {
    std::vector<std::string> out;
    const toml::node* n = t.get(key);
    if (!n) return out;
    const toml::array* arr = n->as_array();
    if (!arr) throw Error(key_path(table, key) + " must be an array of strings");
    for (const auto& e : *arr) {
      auto s = e.value<std::string>();
      if (!s || !e.is_string()) throw Error(key_path(table, key) + " must be an array of strings");
      out.push_back(*s);
    }
    return out;
  }

  Options options(const toml::table& t, const std::string& table) const {
    Options o("[" + table + "]");
    for (const auto& [k, v] : t) {
      std::string key(k.str());
      if (v.is_boolean()) o.set(key, *v.value<bool>());
      else if (v.is_integer()) o.set(key, *v.value<std::int64_t>());
      else if (v.is_floating_point()) {
        const double d = *v.value<double>();
        if (!std::isfinite(d)) throw Error(key_path(table, key) + " must be a finite number, not " + std::to_string(d));
        o.set(key, d);
      } else if (v.is_string()) o.set(key, *v.value<std::string>());
      else throw Error(key_path(table, key) + " must be a boolean, number or string");
    }
    return o;
  }

  /// Reads a [w]/[a]-style table into `out`, over the values already there. Option sub-tables
  /// given here replace the inherited ones; when this table changes the observer (quantizer),
  /// the inherited observer (quantizer) options are dropped, since they were for another one.
  void quant_table(const toml::table& t, const std::string& name, QuantTableConfig& out) const {
    const std::string inherited_observer = out.observer, inherited_quantizer = out.quantizer;
    check_keys(t, name,
               {"type", "qscheme", "bits", "group_size", "observer", "quantizer", "narrow_range", "reduce_range",
                "embeddings", "disable", "observer_options", "quantizer_options"});
    out.qscheme = get<std::string>(t, name, "qscheme", out.qscheme, "a string");
    static const std::vector<std::string> schemes = {"per-tensor-symmetric",  "per-tensor-affine",
                                                     "per-channel-symmetric", "per-channel-affine",
                                                     "per-group-symmetric",   "per-group-affine"};
    if (std::find(schemes.begin(), schemes.end(), out.qscheme) == schemes.end()) {
      std::string hint = nearest(out.qscheme, schemes);
      throw Error(key_path(name, "qscheme") + ": unknown scheme '" + printable(out.qscheme) + "'" +
                  (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                  " (per-{tensor,channel,group}-{symmetric,affine})");
    }
    std::int64_t group = get<std::int64_t>(t, name, "group_size", out.group_size, "an integer");
    const bool grouped = out.qscheme.rfind("per-group", 0) == 0;
    if (grouped && group < 1)
      throw Error(key_path(name, "group_size") + " must be set (>= 1) with qscheme = \"" + out.qscheme + "\"");
    if (group > (std::int64_t{1} << 31))  // also keeps (K + group - 1) / group from overflowing
      throw Error(key_path(name, "group_size") + " = " + std::to_string(group) +
                  " is larger than any weight row (at most 2^31); one group per row is qscheme = \"per-channel-" +
                  (out.qscheme.find("affine") != std::string::npos ? "affine" : "symmetric") + "\"");
    if (grouped && name.back() == 'a')
      throw Error(key_path(name, "qscheme") + ": per-group quantization is for weights ([w])");
    out.group_size = group;
    std::int64_t bits = get<std::int64_t>(t, name, "bits", out.bits, "an integer");
    if (bits < 2 || bits > 16)
      throw Error(key_path(name, "bits") + " must be between 2 and 16, got " + std::to_string(bits));
    out.bits = static_cast<int>(bits);
    out.observer = get<std::string>(t, name, "observer", out.observer, "a string");
    out.quantizer = get<std::string>(t, name, "quantizer", out.quantizer, "a string");
    out.narrow_range = get<bool>(t, name, "narrow_range", out.narrow_range, "true or false");
    out.reduce_range = get<bool>(t, name, "reduce_range", out.reduce_range, "true or false");
    if (t.contains("reduce_range") && out.reduce_range && name.back() == 'a')
      throw Error(key_path(name, "reduce_range") + ": reduce range is for weights ([w]); activations keep 8 bits");
    if (t.contains("reduce_range") && out.reduce_range && out.bits != 8)  // inherited, it applies at 8 bits only
      throw Error(key_path(name, "reduce_range") +
                  " puts 8-bit weights on a 7-bit grid; it needs bits = 8 (bits = " + std::to_string(out.bits) + ")");
    out.type = get<std::string>(t, name, "type", out.type, "a string");
    static const std::vector<std::string> types = {"int", "fp8_e4m3", "fp8_e5m2"};
    if (std::find(types.begin(), types.end(), out.type) == types.end()) {
      std::string hint = nearest(out.type, types);
      throw Error(key_path(name, "type") + ": unknown type '" + printable(out.type) + "'" +
                  (hint.empty() ? "" : "; did you mean '" + hint + "'?") + " (int, fp8_e4m3 or fp8_e5m2)");
    }
    if (out.type != "int") {  // Note [Float8 elements]: 8-bit floats, symmetric, no integer options
      const std::string why = key_path(name, "type") + " = \"" + out.type + "\" ";
      if (grouped) throw Error(why + "takes per-tensor or per-channel scales, not qscheme = \"" + out.qscheme + "\"");
      if (out.qscheme.find("affine") != std::string::npos)
        throw Error(why + "is symmetric (zero point 0): use qscheme = \"" +
                    out.qscheme.substr(0, out.qscheme.rfind('-')) + "-symmetric\"");
      if (t.contains("bits") && out.bits != 8)
        throw Error(why + "is 8 bits wide; " +
                    (t.contains("type") ? "remove bits = " + std::to_string(out.bits)
                                        : "the type is inherited: set type = \"int\" here for a " +
                                              std::to_string(out.bits) + "-bit integer grid"));
      if (out.narrow_range || out.reduce_range)
        throw Error(why + "has no integer range to narrow or reduce; remove " +
                    (out.narrow_range ? "narrow_range" : "reduce_range"));
      out.bits = 8;
    }
    out.embeddings = get<bool>(t, name, "embeddings", out.embeddings, "true or false");
    if (t.contains("embeddings") && name.back() == 'a')
      throw Error(key_path(name, "embeddings") + ": embedding tables are weights; set it in [w]");
    out.disable = get<bool>(t, name, "disable", out.disable, "true or false");
    for (const char* sub : {"observer_options", "quantizer_options"}) {
      const bool is_observer = std::string(sub) == "observer_options";
      Options& target = is_observer ? out.observer_options : out.quantizer_options;
      const bool changed = is_observer ? out.observer != inherited_observer : out.quantizer != inherited_quantizer;
      const toml::node* n = t.get(sub);
      std::string sub_name = name + "." + sub;
      if (n) {
        if (!n->is_table()) throw Error(key_path(name, sub) + " must be a table");
        target = options(*n->as_table(), sub_name);
      } else if (changed || target.where().empty()) {
        target = Options("[" + sub_name + "]");
      }
    }
  }

  double ratio(const toml::table& t, const std::string& table, double fallback) const {
    const double v = get<double>(t, table, "ratio", fallback, "a number");
    if (!(v >= 0 && v < 1))
      throw Error(key_path(table, "ratio") + " must be at least 0 and below 1, got " + std::to_string(v));
    return v;
  }

  SparseSpecific sparse_specific(const toml::table& t, const std::string& table, const std::string& name,
                                 const std::vector<std::string>& nodes) const {
    check_keys(t, table, {"ratio", "nodes"});
    SparseSpecific s;
    s.name = name;
    s.nodes = nodes;
    if (const toml::node* n = t.get("nodes"); n && n->is_string()) {
      s.nodes = {*n->value<std::string>()};
      check_glob(s.nodes[0], table, "nodes");
    } else if (n) s.nodes = globs(t, table, "nodes");
    if (s.nodes.empty())
      throw Error(key_path(table, "nodes") + " is required: a glob (or list of globs) over node names");
    if (!t.get("ratio")) throw Error(key_path(table, "ratio") + " is required (0 keeps the nodes dense)");
    s.ratio = ratio(t, table, 0);
    return s;
  }

  SparseConfig sparse_table(const toml::table& t) const {
    check_keys(t, "sparse",
               {"sparser", "ratio", "granularity", "scope", "round_to", "bias_compensation", "skip", "specific",
                "sparser_options"});
    SparseConfig s;
    s.sparser = get<std::string>(t, "sparse", "sparser", s.sparser, "a string");
    s.ratio_set = t.get("ratio") != nullptr;
    s.ratio = ratio(t, "sparse", s.ratio);
    s.granularity = get<std::string>(t, "sparse", "granularity", s.granularity, "a string");
    s.scope = get<std::string>(t, "sparse", "scope", s.scope, "a string");
    if (s.scope != "layer" && s.scope != "global")
      throw Error(key_path("sparse", "scope") + " must be \"layer\" or \"global\"");
    s.round_to = get<std::int64_t>(t, "sparse", "round_to", s.round_to, "an integer");
    if (s.round_to < 1 || s.round_to > 4096)
      throw Error(key_path("sparse", "round_to") + " must be between 1 and 4096");
    s.bias_compensation = get<bool>(t, "sparse", "bias_compensation", s.bias_compensation, "true or false");
    s.skip = globs(t, "sparse", "skip");
    if (const toml::node* n = t.get("sparser_options")) {
      if (!n->is_table()) throw Error(key_path("sparse", "sparser_options") + " must be a table");
      s.sparser_options = options(*n->as_table(), "sparse.sparser_options");
    }
    if (const toml::node* n = t.get("specific")) {
      const toml::array* entries = n->as_array();
      if (!entries) throw Error(source + ": 'sparse.specific' must be an array of tables ([[sparse.specific]])");
      for (std::size_t i = 0; i < entries->size(); ++i) {
        const toml::table* e = (*entries)[i].as_table();
        const std::string name = "sparse.specific[" + std::to_string(i) + "]";
        if (!e) throw Error(source + ": " + name + " must be a table ([[sparse.specific]])");
        s.specific.push_back(sparse_specific(*e, name, "[[sparse.specific]] #" + std::to_string(i + 1), {}));
      }
    }
    return s;
  }
};

/// The config's other tables (config_sections.cpp), each read into `c` from its table `t`.
void read_calibration(const Reader& r, const toml::table* t, Config& c);
void read_export(const Reader& r, const toml::table* t, Config& c);
void read_latency(const Reader& r, const toml::table* t, Config& c);
void read_data(const Reader& r, const toml::table* t, Config& c);
void read_qat(const Reader& r, const toml::table* t, Config& c);
void read_target(const Reader& r, const toml::table* t, Config& c);
void read_bit_allocation(const Reader& r, const toml::table* t, Config& c);
void read_plugins(const Reader& r, const toml::table* t, const std::string& source_name, Config& c);

}  // namespace sparsebit::config_detail
