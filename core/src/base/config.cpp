#include "sparsebit/core/config.h"

#include "base/config_reader.h"
#include "base/digest.h"
#include "base/glob.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace fs = std::filesystem;

std::string nearest(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    std::vector<std::size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (std::size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= key.size(); ++i) {
      cur[0] = i;
      for (std::size_t j = 1; j <= c.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (key[i - 1] == c[j - 1] ? 0 : 1)});
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  // Only suggest when the typo is plausibly a typo.
  return best_d <= std::max<std::size_t>(2, key.size() / 3) ? best : std::string();
}

QSpec QuantTableConfig::spec(bool is_weight, std::int64_t channel_axis) const {
  QSpec s;
  s.bits = bits;
  s.symmetric = qscheme.find("symmetric") != std::string::npos;
  s.per_channel = qscheme.rfind("per-channel", 0) == 0 || qscheme.rfind("per-group", 0) == 0;
  s.channel_axis = channel_axis;
  if (qscheme.rfind("per-group", 0) == 0) {
    s.group_size = group_size;
    s.group_axis = channel_axis == 0 ? 1 : 0;  // the input-channel axis of the weight
  }
  s.narrow_range = narrow_range;
  s.is_weight = is_weight;
  if (type == "fp8_e4m3") s.element = QElement::kFloat8E4M3FN;
  else if (type == "fp8_e5m2") s.element = QElement::kFloat8E5M2;
  if (reduce_range && is_weight && bits == 8) {
    s.bits = 7;
    s.reduce_range = true;
  }
  return s;
}

Config::Config() {
  w.qscheme = "per-channel-symmetric";
  a.qscheme = "per-tensor-symmetric";
  a.observer = "auto";  // Note [Range selection]: the range each input's layer does best with
  w.observer_options = Options("[w.observer_options]");
  w.quantizer_options = Options("[w.quantizer_options]");
  a.observer_options = Options("[a.observer_options]");
  a.quantizer_options = Options("[a.quantizer_options]");
}

using config_detail::Reader;

namespace {

/// Refuses a key of more than kMaxKeyParts dotted parts (`a.b.c = 1`, `[a.b.c]`) before toml++
/// sees it: the parser nests one table per part and recurses through them, so a key of 100,000
/// parts exhausts the stack. Strings (one-line and multi-line) and comments are skipped; a run of
/// key characters, quoted parts and dots counts its dots, so numbers and dates never come close.
void check_key_depth(const std::string& text, const std::string& source_name) {
  constexpr std::size_t kMaxKeyParts = 64;  // Sparsebit's deepest key has 3
  std::size_t parts = 1, line = 1;
  auto refuse = [&] {
    throw Error(source_name + ":" + std::to_string(line) + ": a key of more than " + std::to_string(kMaxKeyParts) +
                " dotted parts; Sparsebit's keys have at most 3 (e.g. a.observer_options.alpha)");
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '#') {  // comment: to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (ch == '"' || ch == '\'') {
      const bool multi = text.compare(i, 3, std::string(3, ch)) == 0;
      const std::string close = multi ? std::string(3, ch) : std::string(1, ch);
      std::size_t j = i + close.size();
      for (; j < text.size(); ++j) {
        if (text[j] == '\n') {
          if (!multi) break;  // an unterminated one-line string: toml++ reports it
          ++line;
        }
        if (ch == '"' && text[j] == '\\') {
          ++j;
          continue;
        }
        if (text.compare(j, close.size(), close) == 0) break;
      }
      i = std::min(j + close.size(), text.size()) - 1;  // a quoted part keeps the run going
    } else if (ch == '.') {
      if (++parts > kMaxKeyParts) refuse();
    } else if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == ' ' || ch == '\t')) {
      parts = 1;
      if (ch == '\n') ++line;
    }
  }
}

void read_specific(const Reader& r, const toml::node* n, const std::string& source_name, Config& c,
                   std::vector<SparseSpecific>& top_level_sparse) {
  const toml::array* entries = n->as_array();
  if (!entries) throw Error(source_name + ": 'specific' must be an array of tables ([[specific]])");
  for (std::size_t i = 0; i < entries->size(); ++i) {
    const std::string name = "specific[" + std::to_string(i) + "]";
    const toml::table* t = (*entries)[i].as_table();
    if (!t) throw Error(source_name + ": " + name + " must be a table ([[specific]])");
    r.check_keys(*t, name, {"nodes", "w", "a", "sparse"});
    SpecificEntry e;
    e.name = "[[specific]] #" + std::to_string(i + 1);
    if (const toml::node* nodes = t->get("nodes"); nodes && nodes->is_string()) {
      e.nodes = {*nodes->value<std::string>()};
      r.check_glob(e.nodes[0], name, "nodes");
    } else e.nodes = r.globs(*t, name, "nodes");
    if (e.nodes.empty())
      throw Error(r.key_path(name, "nodes") + " is required: a glob (or list of globs) over node names");
    e.w = c.w;
    e.a = c.a;
    e.sets_w = t->get("w") != nullptr;
    e.sets_a = t->get("a") != nullptr;
    for (const char* side : {"w", "a"}) {
      const toml::node* sub = t->get(side);
      if (!sub) continue;
      if (!sub->is_table()) throw Error(r.key_path(name, side) + " must be a table, e.g. " + side + " = { bits = 4 }");
      if (std::string(side) == "a" && c.weight_only) e.a.disable = false;
      r.quant_table(*sub->as_table(), name + "." + side, std::string(side) == "w" ? e.w : e.a);
    }
    if (const toml::node* sub = t->get("sparse")) {
      if (!sub->is_table()) throw Error(r.key_path(name, "sparse") + " must be a table, e.g. sparse = { ratio = 0.3 }");
      if (!c.sparse) throw Error(r.key_path(name, "sparse") + " needs a [sparse] table that says how to prune");
      top_level_sparse.push_back(r.sparse_specific(*sub->as_table(), name + ".sparse", e.name, e.nodes));
    }
    if (t->get("w") || t->get("a") || !t->get("sparse")) c.specific.push_back(std::move(e));
  }
}

// Which names are passes is known only once plugins are loaded: resolve_schedule checks them.
void read_passes(const Reader& r, const toml::table* t, Config& c) {
  c.passes.extra = r.strings(*t, "passes", "extra");
  c.passes.order = r.strings(*t, "passes", "order");
  for (const auto& [key, node] : *t) {
    const std::string name(key.str());
    if (name == "extra" || name == "order") continue;
    if (!node.is_table())
      throw Error(r.key_path("passes", name) + " must be a table of options for pass '" + name + "' ([passes." + name +
                  "]); the other keys of [passes] are extra and order");
    c.passes.options.insert_or_assign(name, r.options(*node.as_table(), "passes." + name));
  }
}

void read_schedule(const Reader& r, const toml::table* t, Config& c) {
  for (const auto& [key, node] : *t) {
    const std::string name(key.str());
    c.passes.switches[name] = r.get<bool>(*t, "schedule", name, false, "true or false");
  }
}

}  // namespace

Config Config::from_string(const std::string& text, const std::string& source_name) {
  check_key_depth(text, source_name);
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw Error(source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                ": invalid TOML: " + std::string(e.description()));
  }
  Config c;
  c.source = source_name;
  Digest64 digest;
  digest.mix(text);
  c.text_digest = digest.value;
  Reader r{c.source};
  r.check_keys(root, "",
               {"backend", "skip", "w", "a", "specific", "schedule", "passes", "calibration", "qat", "sparse", "target",
                "export", "plugins", "bit_allocation", "latency", "data"});
  c.backend = r.get<std::string>(root, "", "backend", c.backend, "a string");
  c.skip = r.globs(root, "", "skip");
  auto table = [&](const char* key) -> const toml::table* {
    const toml::node* n = root.get(key);
    if (!n) return nullptr;
    if (!n->is_table()) throw Error(source_name + ": '" + key + "' must be a table ([" + key + "])");
    return n->as_table();
  };
  if (auto* t = table("w")) r.quant_table(*t, "w", c.w);
  if (auto* t = table("a")) r.quant_table(*t, "a", c.a);
  c.quantization_given = root.get("w") || root.get("a");
  // Note [Weight-only quantization]: [w] without [a] quantizes weights only (INT4/INT8 weights
  // of language models); a [[specific]] entry's `a` table turns activations on for its nodes.
  c.weight_only = root.get("w") && !root.get("a");
  if (c.weight_only) c.a.disable = true;
  if (auto* t = table("sparse")) c.sparse = r.sparse_table(*t);
  std::vector<SparseSpecific> top_level_sparse;  // from [[specific]] sparse = {...}, after [[sparse.specific]]
  if (const toml::node* n = root.get("specific")) read_specific(r, n, source_name, c, top_level_sparse);
  if (c.sparse) c.sparse->specific.insert(c.sparse->specific.end(), top_level_sparse.begin(), top_level_sparse.end());
  if (auto* t = table("passes")) read_passes(r, t, c);
  if (auto* t = table("schedule")) read_schedule(r, t, c);
  if (auto* t = table("calibration")) read_calibration(r, t, c);
  if (auto* t = table("export")) read_export(r, t, c);
  if (auto* t = table("latency")) read_latency(r, t, c);
  if (auto* t = table("qat")) read_qat(r, t, c);
  if (auto* t = table("target")) read_target(r, t, c);
  if (auto* t = table("plugins")) read_plugins(r, t, source_name, c);
  if (auto* t = table("bit_allocation")) read_bit_allocation(r, t, c);
  if (auto* t = table("data")) read_data(r, t, c);
  return c;
}

std::string TargetConfig::describe() const {
  std::ostringstream os;
  os << metric << (higher_is_better() ? ">=" : "<=") << value;
  return os.str();
}

void TargetConfig::parse_expression(const std::string& text, const std::string& where) {
  static const std::regex form(
      R"(\s*(cosine|sqnr|mse|maxabs|argmax-agreement|ctc-agreement|top1-drop)\s*(>=|<=)\s*([-+0-9.eE]+)\s*)");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw Error(where + ": '" + printable(text, 60) +
                "' is not a target; write METRIC>=VALUE or METRIC<=VALUE: cosine>=0.99, sqnr>=30, mse<=1e-4, "
                "maxabs<=0.02, argmax-agreement>=0.99, ctc-agreement>=0.99, top1-drop<=0.5");
  metric = m[1];
  const std::string want = higher_is_better() ? ">=" : "<=";
  if (m[2] != want) throw Error(where + ": " + metric + " takes " + want + " (" + metric + want + m[3].str() + ")");
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(m[3].str(), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != m[3].length() || !std::isfinite(v)) throw Error(where + ": '" + m[3].str() + "' is not a number");
  value = v;
  has_value = true;
  check_value(where);
}

void TargetConfig::check_value(const std::string& where) const {
  // Bounds that always hold (cosine>=-1) are accepted; only those that never can are refused. A
  // top-1 drop may be negative (the quantized model ahead), an SQNR anything.
  if (metric == "cosine" && value > 1)
    throw Error(where + ": " + describe() + " can never hold (cosine lies in [-1, 1])");
  if ((metric == "mse" || metric == "maxabs") && value < 0)
    throw Error(where + ": " + describe() + " can never hold (it is never negative)");
  if ((metric == "argmax-agreement" || metric == "ctc-agreement") && value > 1)
    throw Error(where + ": " + describe() + " can never hold (it is a share, at most 1)");
}

std::string one_line_message(const std::string& text, std::size_t max) {
  if (text.size() <= max) return printable(text, max);
  const std::size_t tail = max / 4;
  return printable(text.substr(0, max - tail), max) + "... (" + std::to_string(text.size()) + " characters) ..." +
         printable(text.substr(text.size() - tail), max);
}

std::string module_path_of(const std::string& node_name) {
  if (node_name.size() < 2 || node_name[0] != '/') return {};
  std::vector<std::string> scopes;
  std::size_t begin = 1;
  for (std::size_t slash; (slash = node_name.find('/', begin)) != std::string::npos; begin = slash + 1)
    scopes.push_back(node_name.substr(begin, slash - begin));
  if (scopes.empty()) return {};
  for (const auto& s : scopes) {
    const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
    });
    if (!plain) return {};
  }
  // A container's child is scoped "<container>.<index>" after the container's own scope.
  std::vector<std::string> parts;
  for (const auto& s : scopes) {
    if (!parts.empty() && s.rfind(parts.back() + ".", 0) == 0) parts.back() = s;
    else parts.push_back(s);
  }
  std::string path;
  for (const auto& p : parts) path += (path.empty() ? "" : ".") + p;
  return path;
}

Config Config::from_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw Error(path +
                ": is a folder; give the config's TOML (or original YAML) file (e.g. configs/w8a8_tensorrt.toml)");
  if (!fs::exists(path, ec))
    throw Error(
        path + ": " +
        (ec && ec != std::errc::no_such_file_or_directory ? ec.message() : std::string("config file not found")));
  if (!fs::is_regular_file(path, ec)) throw Error(path + ": is a device, pipe or socket, not a TOML file");
  std::ifstream in(path);
  if (!in) throw Error(path + ": config file cannot be read");
  note_file_read(path);  // Note [Files a run read]
  std::stringstream ss;
  ss << in.rdbuf();
  if (is_yaml_config(path)) return from_string(yaml_config_to_toml(ss.str(), path), path);
  return from_string(ss.str(), path);
}

}  // namespace sparsebit
