// The original toolkit's YAML configs (upper-case keys: BACKEND, SCHEDULE, W, A, ...) read onto
// Sparsebit's TOML schema. Note [YAML configs]: the YAML is turned into TOML text, which
// Config::from_string then reads, so both spellings go through one reader and `sparsebit config
// convert` writes exactly what `-c config.yaml` runs. Keys keep the original's defaults and
// meanings (FUSE_BN is off unless asked, BIT 0 turns a side off, SPECIFIC matches module names);
// keys without an equivalent are refused, naming the key and why.

#include <yaml-cpp/yaml.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

/// One side (W or A) as the original's schema holds it, with its defaults.
struct Side {
  bool is_a = false;
  std::string qscheme;  // no default: the original refuses a config without one
  std::string quantizer = "uniform";
  bool disable = false;
  std::int64_t bit = -1;  // the original's "unset", refused when the side quantizes
  std::string observer = "minmax";
  double percentile_alpha = 0.001;
  std::string aciq_distribution = "gaus";
  double ema_ratio = 0.9;
  double pact_alpha = 10;
  std::string layout = "NCHW";
};

class YamlReader {
 public:
  explicit YamlReader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key, const std::string& why) const {
    std::string where = source_;
    if (at.IsDefined() && at.Mark().line >= 0) where += ":" + std::to_string(at.Mark().line + 1);
    throw Error(where + ": " + key + ": " + why);
  }

  void require_map(const YAML::Node& n, const std::string& key) const {
    if (!n.IsMap()) fail(n, key, "must be a mapping of upper-case keys");
  }

  /// Every key of `map` is one of `known` (exactly: the original's keys are upper case).
  void check_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known) const {
    for (const auto& kv : map) {
      const std::string key = kv.first.as<std::string>();
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string hint = nearest(key, known);
      for (const auto& k : known)  // a lower-case spelling, or a key cut short
        if (lower(k) == lower(key) || (hint.empty() && k.rfind(key, 0) == 0)) hint = k;
      fail(kv.first, join(path, key),
           "not a key of the original schema here" + (hint.empty() ? "" : " (did you mean " + join(path, hint) + "?)") +
               "; known: " + list(known));
    }
  }

  std::string text(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail(n, key, "must be a string");
    return n.as<std::string>();
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    bool v = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) fail(n, key, "must be True or False");
    return v;
  }
  double number(const YAML::Node& n, const std::string& key) const {
    double v = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v)) fail(n, key, "must be a number");
    return v;
  }
  std::int64_t integer(const YAML::Node& n, const std::string& key) const {
    std::int64_t v = 0;
    if (!n.IsScalar() || !YAML::convert<std::int64_t>::decode(n, v)) fail(n, key, "must be an integer");
    return v;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string list(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }

  /// Sets one of a side's dotted keys (as the schema nests them, or as SPECIFIC lists them).
  void set(Side& s, const std::string& key, const YAML::Node& v, const std::string& path) const {
    const std::string full = join(path, key);
    if (key == "QSCHEME") {
      s.qscheme = text(v, full);
      static const std::vector<std::string> schemes = {"per-tensor-symmetric", "per-tensor-affine",
                                                       "per-channel-symmetric", "per-channel-affine"};
      if (std::find(schemes.begin(), schemes.end(), s.qscheme) == schemes.end())
        fail(v, full, "'" + s.qscheme + "' is not a scheme of the original; use " + list(schemes));
    } else if (key == "QUANTIZER.TYPE") {
      static const std::map<std::string, std::string> types = {
          {"uniform", "uniform"}, {"lsq", "lsq"},       {"lsq+", "lsq_plus"},    {"lsq_plus", "lsq_plus"},
          {"pact", "pact"},       {"dorefa", "dorefa"}, {"adaround", "adaround"}};
      auto it = types.find(lower(text(v, full)));
      if (it == types.end())
        fail(v, full, "'" + text(v, full) + "' is not a quantizer; use uniform, lsq, lsq+, pact, dorefa or adaround");
      s.quantizer = it->second;
    } else if (key == "QUANTIZER.DISABLE") {
      s.disable = boolean(v, full);
    } else if (key == "QUANTIZER.BIT") {
      s.bit = integer(v, full);
      if (s.bit != 0 && (s.bit < 2 || s.bit > 16))
        fail(v, full, "must be 0 (no quantization) or 2 to 16, got " + std::to_string(s.bit));
    } else if (key == "OBSERVER.TYPE") {
      static const std::vector<std::string> types = {"minmax",       "mse",  "percentile",
                                                     "kl_histogram", "aciq", "moving_average"};
      s.observer = lower(text(v, full));
      if (std::find(types.begin(), types.end(), s.observer) == types.end())
        fail(v, full,
             "'" + text(v, full) + "' is not an observer; use MINMAX, MSE, PERCENTILE, KL_HISTOGRAM, ACIQ or " +
                 "MOVING_AVERAGE");
    } else if (key == "OBSERVER.PERCENTILE.ALPHA") {
      s.percentile_alpha = number(v, full);
    } else if (key == "OBSERVER.ACIQ.DISTRIBUTION") {
      s.aciq_distribution = lower(text(v, full));
      if (s.aciq_distribution != "gaus" && s.aciq_distribution != "laplace")
        fail(v, full, "must be GAUS or LAPLACE, got '" + text(v, full) + "'");
    } else if (s.is_a && key == "OBSERVER.MOVING_AVERAGE.EMA_RATIO") {
      s.ema_ratio = number(v, full);
    } else if (s.is_a && key == "QUANTIZER.PACT.ALPHA_VALUE") {
      s.pact_alpha = number(v, full);
    } else if (s.is_a && key == "OBSERVER.LAYOUT") {
      s.layout = text(v, full);
      if (s.layout != "NCHW" && s.layout != "NLC") fail(v, full, "must be NCHW or NLC, got '" + s.layout + "'");
    } else if (s.is_a && key == "QADD.ENABLE_QUANT") {
      if (boolean(v, full))
        fail(v, full,
             "not supported: which inputs of an Add are quantized is the backend's placement (BACKEND), with no "
             "switch of its own; remove the key or set it to False");
    } else if (key.rfind("QUANTIZER.TRAINING", 0) == 0) {
      fail(v, full,
           "not supported: training is `sparsebit qat` (or QuantModel.init_qat in Python) with the [qat] table; "
           "remove the key");
    } else {
      std::vector<std::string> keys = {"QSCHEME",
                                       "QUANTIZER.TYPE",
                                       "QUANTIZER.DISABLE",
                                       "QUANTIZER.BIT",
                                       "OBSERVER.TYPE",
                                       "OBSERVER.PERCENTILE.ALPHA",
                                       "OBSERVER.ACIQ.DISTRIBUTION"};
      if (s.is_a)
        keys.insert(keys.end(), {"QUANTIZER.PACT.ALPHA_VALUE", "OBSERVER.MOVING_AVERAGE.EMA_RATIO", "OBSERVER.LAYOUT",
                                 "QADD.ENABLE_QUANT"});
      const std::string hint = nearest(key, keys);
      fail(v, full,
           "not a key of the original schema" + (hint.empty() ? "" : " (did you mean " + join(path, hint) + "?)") +
               "; known: " + list(keys));
    }
  }

  /// Walks a side's nested mapping into dotted keys, SPECIFIC left for later.
  void walk(Side& s, const YAML::Node& map, const std::string& prefix, const std::string& path) const {
    for (const auto& kv : map) {
      const std::string key = prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>();
      if (prefix.empty() && key == "SPECIFIC") continue;
      if (kv.second.IsMap()) walk(s, kv.second, key, path);
      else set(s, key, kv.second, path);
    }
  }

  /// The TOML table of a side: every key, so a [[specific]] entry states the whole setting as
  /// the original's merged copy of the side does.
  toml::table table(const Side& s, const YAML::Node& at, const std::string& path) const {
    toml::table t;
    const bool off = s.disable || s.bit == 0;
    if (off) {
      t.insert("disable", true);
      return t;
    }
    if (s.bit < 0)
      fail(at, path + ".QUANTIZER.BIT",
           "must be set: the original's default (-1) is not a bit width; 0 turns " + path + " off");
    if (s.qscheme.empty())
      fail(at, path + ".QSCHEME",
           "must be set (the original has no default): per-channel-symmetric, per-tensor-affine, ...");
    if (s.is_a && s.layout == "NLC" && s.qscheme.rfind("per-channel", 0) == 0)
      fail(at, path + ".OBSERVER.LAYOUT",
           "NLC with per-channel activations is not supported: activations' channels are read on axis 1 (NCHW); use "
           "a per-tensor QSCHEME");
    t.insert("qscheme", s.qscheme);
    t.insert("bits", s.bit);
    t.insert("quantizer", s.quantizer);
    t.insert("observer", s.observer);
    t.insert("disable", false);
    toml::table observer_options;
    if (s.observer == "percentile") observer_options.insert("alpha", s.percentile_alpha);
    if (s.observer == "aciq") observer_options.insert("distribution", s.aciq_distribution);
    if (s.observer == "moving_average") observer_options.insert("ema_ratio", s.ema_ratio);
    if (!observer_options.empty()) t.insert("observer_options", std::move(observer_options));
    toml::table quantizer_options;
    if (s.quantizer == "pact") quantizer_options.insert("alpha", s.pact_alpha);
    if (!quantizer_options.empty()) t.insert("quantizer_options", std::move(quantizer_options));
    return t;
  }

  /// SPECIFIC: [{glob: [KEY, value, KEY, value, ...], ...}], the first glob matching a module wins.
  void specific(const Side& base, const YAML::Node& list, const std::string& path, toml::array& out) const {
    const std::string key = path + ".SPECIFIC";
    if (!list.IsSequence()) fail(list, key, "must be a list holding one mapping {glob: [KEY, value, ...]}");
    if (list.size() > 1)
      fail(list, key,
           "has " + std::to_string(list.size()) +
               " mappings; the original reads only the first, so merge them into "
               "one");
    if (list.size() == 0) return;
    const YAML::Node& entries = list[0];
    if (!entries.IsMap()) fail(entries, key, "must be a list holding one mapping {glob: [KEY, value, ...]}");
    for (const auto& kv : entries) {
      const std::string glob = kv.first.as<std::string>();
      const std::string entry = key + "['" + glob + "']";
      const YAML::Node& pairs = kv.second;
      if (!pairs.IsSequence() || pairs.size() % 2 != 0 || pairs.size() == 0)
        fail(pairs, entry, "must be a list of KEY, value pairs, e.g. [\"QUANTIZER.BIT\", 8]");
      Side s = base;
      for (std::size_t i = 0; i < pairs.size(); i += 2) set(s, text(pairs[i], entry), pairs[i + 1], entry);
      toml::table t;
      t.insert("nodes", toml::array{glob});
      t.insert(s.is_a ? "a" : "w", table(s, pairs, entry));
      out.push_back(std::move(t));
    }
  }

 private:
  std::string source_;
};

}  // namespace

bool is_yaml_config(const std::string& path) {
  const std::string ext = lower(std::filesystem::path(path).extension().string());
  return ext == ".yaml" || ext == ".yml";
}

namespace {
std::string convert(const std::string& text, const std::string& source_name);
}  // namespace

std::string yaml_config_to_toml(const std::string& text, const std::string& source_name) {
  try {
    return convert(text, source_name);
  } catch (const YAML::Exception& e) {  // a node of another kind than asked (a mapping as a key)
    throw Error(source_name + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) + ": " +
                e.msg + "; the original's configs hold mappings of upper-case names to values and lists");
  }
}

namespace {
std::string convert(const std::string& text, const std::string& source_name) {
  YAML::Node loaded;
  try {
    loaded = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(source_name + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                ": invalid YAML: " + e.msg);
  }
  const YAML::Node& root = loaded;  // const: looking a key up never adds it
  YamlReader r(source_name);
  if (root.IsNull()) throw Error(source_name + ": the YAML config is empty; it needs at least W and A");
  r.require_map(root, "the document");
  r.check_keys(root, "", {"BACKEND", "SKIP_TRACE_MODULES", "SCHEDULE", "W", "A", "DEVICE"});
  toml::table out;
  std::vector<std::string> notes;
  const std::string backend = root["BACKEND"] ? lower(r.text(root["BACKEND"], "BACKEND")) : "virtual";
  if (backend != "virtual" && backend != "onnxruntime" && backend != "tensorrt")
    r.fail(root["BACKEND"], "BACKEND", "'" + backend + "' is not a backend; use virtual, onnxruntime or tensorrt");
  out.insert("backend", backend);
  if (const YAML::Node skip = root["SKIP_TRACE_MODULES"]) {
    if (!skip.IsSequence()) r.fail(skip, "SKIP_TRACE_MODULES", "must be a list of module names");
    // torch.fx needed them to trace; torch.onnx traces through every module, so nothing is left out.
    if (skip.size() > 0)
      notes.push_back("SKIP_TRACE_MODULES: torch.onnx's tracer runs through every module, so the list (" +
                      std::to_string(skip.size()) + " entries) needs no setting here");
  }
  toml::table schedule{{"fuse_bn", false}};  // the original folds BatchNorm only when asked
  bool bn_tuning = false;
  if (const YAML::Node s = root["SCHEDULE"]) {
    r.require_map(s, "SCHEDULE");
    r.check_keys(s, "SCHEDULE", {"FUSE_BN", "BN_TUNING", "DISABLE_UNNECESSARY_QUANT", "BIT_ALLOCATION"});
    if (s["FUSE_BN"]) schedule.insert_or_assign("fuse_bn", r.boolean(s["FUSE_BN"], "SCHEDULE.FUSE_BN"));
    if (s["BN_TUNING"]) bn_tuning = r.boolean(s["BN_TUNING"], "SCHEDULE.BN_TUNING");
    schedule.insert("bn_tuning", bn_tuning);
    if (s["DISABLE_UNNECESSARY_QUANT"])
      schedule.insert("disable_unnecessary_quant",
                      r.boolean(s["DISABLE_UNNECESSARY_QUANT"], "SCHEDULE.DISABLE_UNNECESSARY_QUANT"));
    if (const YAML::Node b = s["BIT_ALLOCATION"]) {
      const std::string path = "SCHEDULE.BIT_ALLOCATION";
      r.require_map(b, path);
      r.check_keys(b, path, {"ENABLE", "AVG_WEIGHT_BIT_TARGET", "AVG_FEATURE_BIT_TARGET"});
      if (b["ENABLE"] && r.boolean(b["ENABLE"], path + ".ENABLE")) {
        toml::table t;
        if (b["AVG_WEIGHT_BIT_TARGET"])
          t.insert("avg_weight_bits", r.number(b["AVG_WEIGHT_BIT_TARGET"], path + ".AVG_WEIGHT_BIT_TARGET"));
        if (b["AVG_FEATURE_BIT_TARGET"])
          t.insert("avg_activation_bits", r.number(b["AVG_FEATURE_BIT_TARGET"], path + ".AVG_FEATURE_BIT_TARGET"));
        if (t.empty()) r.fail(b, path, "ENABLE needs AVG_WEIGHT_BIT_TARGET, AVG_FEATURE_BIT_TARGET or both");
        out.insert("bit_allocation", std::move(t));
      }
    }
  }
  if (const YAML::Node d = root["DEVICE"]) {
    const std::string device = lower(r.text(d, "DEVICE"));
    if (device != "cpu" && device != "cuda") r.fail(d, "DEVICE", "must be cpu or cuda, got '" + device + "'");
    out.insert("calibration", toml::table{{"device", device}});
  }
  toml::array specific;
  Side w, a;
  a.is_a = true;
  for (auto [side, name] : {std::pair<Side*, const char*>{&w, "W"}, {&a, "A"}}) {
    const YAML::Node n = root[name];
    if (!n)
      throw Error(source_name + ": " + name + " is missing: the original needs " + name + ".QSCHEME and " + name +
                  ".QUANTIZER.BIT");
    r.require_map(n, name);
    r.walk(*side, n, "", name);
    if (bn_tuning && side == &w && !w.disable && w.qscheme.rfind("per-channel", 0) != 0)
      r.fail(root["SCHEDULE"]["BN_TUNING"], "SCHEDULE.BN_TUNING", "needs per-channel weights (W.QSCHEME)");
    out.insert(side == &w ? "w" : "a", r.table(*side, n, name));
    if (n["SPECIFIC"]) r.specific(*side, n["SPECIFIC"], name, specific);
  }
  out.insert("schedule", std::move(schedule));
  if (!specific.empty()) out.insert("specific", std::move(specific));
  std::ostringstream os;
  os << "# " << std::filesystem::path(source_name).filename().string()
     << " (the original toolkit's YAML schema) as Sparsebit's TOML; `sparsebit config convert` wrote it.\n";
  for (const auto& n : notes) os << "# " << n << "\n";
  os << "\n" << out << "\n";
  return os.str();
}
}  // namespace

}  // namespace sparsebit
