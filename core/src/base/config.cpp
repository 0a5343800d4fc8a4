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

/// Samples in one calibration batch: more than a million could never fit in memory anyway.
constexpr std::int64_t kMaxBatch = 1 << 20;

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

void read_passes(const Reader& r, const toml::table* t, Config& c) {
  for (const auto& name : r.strings(*t, "passes", "extra")) {
    bool known = false;
    for (const auto& e : c.schedule) known = known || e.pass == name;
    if (known)
      throw Error(r.key_path("passes", "extra") + ": '" + name + "' is already scheduled; turn it on in [schedule]");
    c.schedule.push_back({name, true});
  }
  std::vector<ScheduleEntry> ordered;
  for (const auto& name : r.strings(*t, "passes", "order")) {
    auto it =
        std::find_if(c.schedule.begin(), c.schedule.end(), [&](const ScheduleEntry& e) { return e.pass == name; });
    if (it == c.schedule.end()) {
      std::vector<std::string> known;
      for (const auto& e : c.schedule) known.push_back(e.pass);
      std::string hint = nearest(name, known);
      throw Error(r.key_path("passes", "order") + ": '" + name + "' is not a scheduled pass" +
                  (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; add it to [passes] extra");
    }
    ordered.push_back(std::move(*it));
    c.schedule.erase(it);
  }
  ordered.insert(ordered.end(), std::make_move_iterator(c.schedule.begin()), std::make_move_iterator(c.schedule.end()));
  c.schedule = std::move(ordered);
  std::vector<std::string> keys{"extra", "order"};
  for (const auto& e : c.schedule) keys.push_back(e.pass);
  r.check_keys(*t, "passes", keys);
  for (auto& e : c.schedule) {
    if (const toml::node* n = t->get(e.pass)) {
      if (!n->is_table())
        throw Error(r.key_path("passes", e.pass) + " must be a table of options for pass '" + e.pass + "'");
      e.options = r.options(*n->as_table(), "passes." + e.pass);
    } else {
      e.options = Options("[passes." + e.pass + "]");
    }
  }
}

void read_calibration(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "calibration", {"batch_size", "count", "device", "mode", "cuda_graph", "range_samples"});
  // Checked against the int they are kept in: 2^32 + 2 must not become 2.
  std::int64_t bs = r.get<std::int64_t>(*t, "calibration", "batch_size", c.calibration.batch_size, "an integer");
  if (bs < 1 || bs > kMaxBatch)
    throw Error(r.key_path("calibration", "batch_size") + " must be 1 to " + std::to_string(kMaxBatch) + ", got " +
                std::to_string(bs));
  c.calibration.batch_size = static_cast<int>(bs);
  std::int64_t count = r.get<std::int64_t>(*t, "calibration", "count", c.calibration.count, "an integer");
  if (count < 0 || count > std::numeric_limits<int>::max())
    throw Error(r.key_path("calibration", "count") + " must be 0 (all) to " +
                std::to_string(std::numeric_limits<int>::max()) + ", got " + std::to_string(count));
  c.calibration.count = static_cast<int>(count);
  c.calibration.device = r.get<std::string>(*t, "calibration", "device", c.calibration.device, "a string");
  if (!std::regex_match(c.calibration.device, std::regex("cpu|cuda(:[0-9]{1,3})?")))
    throw Error(r.key_path("calibration", "device") + " must be cpu, cuda or cuda:N, got '" +
                printable(c.calibration.device, 40) + "'");
  c.calibration.cuda_graph = r.get<bool>(*t, "calibration", "cuda_graph", c.calibration.cuda_graph, "true or false");
  const std::int64_t rs =
      r.get<std::int64_t>(*t, "calibration", "range_samples", c.calibration.range_samples, "an integer");
  if (rs < 0 || rs > 1000000)
    throw Error(r.key_path("calibration", "range_samples") + " must be between 0 (off) and 1000000, got " +
                std::to_string(rs));
  c.calibration.range_samples = static_cast<int>(rs);
  c.calibration.mode = r.get<std::string>(*t, "calibration", "mode", c.calibration.mode, "a string");
  if (c.calibration.mode != "streaming" && c.calibration.mode != "layerwise" && c.calibration.mode != "asym")
    throw Error(r.key_path("calibration", "mode") + " must be \"streaming\", \"layerwise\" or \"asym\"");
}

void read_export(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "export", {"weight_format", "accuracy_level"});
  c.export_options.weight_format =
      r.get<std::string>(*t, "export", "weight_format", c.export_options.weight_format, "a string");
  if (c.export_options.weight_format != "dequantize_linear" && c.export_options.weight_format != "matmul_nbits")
    throw Error(r.key_path("export", "weight_format") + " must be \"dequantize_linear\" or \"matmul_nbits\", got '" +
                printable(c.export_options.weight_format, 40) + "'");
  const std::int64_t level =
      r.get<std::int64_t>(*t, "export", "accuracy_level", c.export_options.accuracy_level, "an integer");
  if (level < 0 || level > 4) throw Error(r.key_path("export", "accuracy_level") + " must be 0 to 4");
  c.export_options.accuracy_level = level;
}

void read_latency(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "latency", {"enabled", "threads", "runs", "runtime", "search", "regions"});
  LatencyConfig& l = c.latency;
  if (const toml::node* e = t->get("enabled")) {
    if (const auto b = e->value<bool>()) l.enabled = *b ? "on" : "off";
    else if (e->value<std::string>() == std::optional<std::string>("auto")) l.enabled = "auto";
    else throw Error(r.key_path("latency", "enabled") + " must be true, false or \"auto\"");
  }
  if (const toml::node* n = t->get("threads")) {
    const toml::array* a = n->as_array();
    if (!a || a->empty())
      throw Error(r.key_path("latency", "threads") + " must be a list of thread counts, e.g. [1, 0] (0: every core)");
    l.threads.clear();
    for (const auto& v : *a) {
      const auto k = v.value<std::int64_t>();
      if (!k || *k < 0 || *k > 4096)
        throw Error(r.key_path("latency", "threads") + " must hold thread counts from 0 (every core) to 4096");
      l.threads.push_back(*k);
    }
  }
  l.runs = r.get<std::int64_t>(*t, "latency", "runs", l.runs, "an integer");
  if (l.runs < 1 || l.runs > 100000) throw Error(r.key_path("latency", "runs") + " must be 1 to 100000");
  l.runtime = r.get<std::string>(*t, "latency", "runtime", l.runtime, "a string");
  l.search = r.get<bool>(*t, "latency", "search", l.search, "true or false");
  l.regions = r.get<std::int64_t>(*t, "latency", "regions", l.regions, "an integer");
  if (l.regions < 1 || l.regions > 1000) throw Error(r.key_path("latency", "regions") + " must be 1 to 1000");
}

// The presets: the preprocessing each family's own inference code applies (Note [Image data]).
DataConfig data_preset(const std::string& name, const std::string& where) {
  DataConfig d;
  d.preset = name;
  if (name == "imagenet") {  // torchvision's reference evaluation: Resize(256), CenterCrop(224)
    d.fit = "shorter", d.resize = {256}, d.center_crop = {224, 224};
    d.mean = {0.485, 0.456, 0.406}, d.std = {0.229, 0.224, 0.225};
  } else if (name == "paddleocr_rec") {  // height 48, width up to 320, normalized to [-1, 1], OpenCV's BGR
    d.fit = "height", d.resize = {48, 320}, d.antialias = false, d.channels = "BGR";
    d.mean = {0.5}, d.std = {0.5}, d.pad_value = 127.5;  // pads with 0 after normalizing
  } else if (name == "paddleocr_det") {                  // longer side at most 960, sides multiples of 32
    d.fit = "longer", d.resize = {960}, d.multiple = 32, d.antialias = false, d.channels = "BGR";
    d.mean = {0.485, 0.456, 0.406}, d.std = {0.229, 0.224, 0.225};
  } else if (name == "yolo") {  // letterboxed into 640 x 640 on grey 114, [0, 1]
    d.fit = "letterbox", d.resize = {640, 640}, d.antialias = false, d.pad_value = 114;
  } else {
    const std::vector<std::string> known{"imagenet", "paddleocr_rec", "paddleocr_det", "yolo"};
    const std::string hint = nearest(name, known);
    throw Error(where + ": unknown preset '" + printable(name) + "'" +
                (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                " (imagenet, paddleocr_rec, paddleocr_det, yolo; or set fit, resize, mean, std... yourself)");
  }
  return d;
}

void read_data(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "data",
               {"preset", "fit", "resize", "center_crop", "multiple", "pad_value", "antialias", "channels", "layout",
                "scale", "mean", "std", "undecodable"});
  const std::string preset = r.get<std::string>(*t, "data", "preset", "", "a string");
  DataConfig d = preset.empty() ? DataConfig{} : data_preset(preset, r.key_path("data", "preset"));
  auto one_of = [&](const char* key, const std::string& value, const std::vector<std::string>& allowed) {
    const std::string v = r.get<std::string>(*t, "data", key, value, "a string");
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + (a.empty() ? "\"\"" : a);
      throw Error(r.key_path("data", key) + " must be one of " + list + ", got '" + printable(v) + "'");
    }
    return v;
  };
  // A key given as one value or a list of them, each taken by `take` (false: refused with `form`);
  // false when the key is absent.
  auto one_or_list = [&](const char* key, const std::string& form, const auto& take) {
    const toml::node* n = t->get(key);
    if (!n) return false;
    if (const auto* a = n->as_array()) {
      for (const auto& e : *a)
        if (!take(e)) throw Error(form);
    } else if (!take(*n)) {
      throw Error(form);
    }
    return true;
  };
  // A size: N or [H, W], each 1 to 65536.
  auto sizes = [&](const char* key, std::vector<std::int64_t> value, bool pair_only) {
    const std::string form = r.key_path("data", key) + " must be N or [height, width] with sizes 1 to 65536";
    std::vector<std::int64_t> got;
    const bool given = one_or_list(key, form, [&](const toml::node& e) {
      const auto v = e.value<std::int64_t>();
      if (!v || !e.is_integer() || *v < 1 || *v > 65536) return false;
      got.push_back(*v);
      return true;
    });
    if (!given) return value;
    if (t->get(key)->is_array() ? got.size() != 2 : got.size() != 1) throw Error(form);
    if (pair_only && got.size() == 1) got = {got[0], got[0]};
    return got;
  };
  auto numbers = [&](const char* key, std::vector<double> value) {
    const std::string form = r.key_path("data", key) + " must be a number or a list of one number per channel";
    std::vector<double> got;
    const bool given = one_or_list(key, form, [&](const toml::node& e) {
      const auto v = e.value<double>();
      if (!v || !std::isfinite(*v) || !(e.is_floating_point() || e.is_integer())) return false;
      got.push_back(*v);
      return true;
    });
    if (!given) return value;
    if (got.empty() || got.size() > 4) throw Error(form);
    return got;
  };
  d.fit = one_of("fit", d.fit, {"", "shorter", "exact", "height", "longer", "letterbox"});
  d.resize = sizes("resize", d.resize, false);
  d.center_crop = sizes("center_crop", d.center_crop, true);
  if (t->get("resize") && !t->get("fit") && preset.empty()) d.fit = d.resize.size() == 1 ? "shorter" : "exact";
  if (!d.fit.empty() && d.resize.empty())
    throw Error(r.key_path("data", "fit") + " = \"" + d.fit + "\" needs resize (N or [height, width])");
  if (d.resize.size() == 1 && (d.fit == "exact" || d.fit == "height" || d.fit == "letterbox"))
    d.resize = {d.resize[0], d.resize[0]};
  if (d.resize.size() == 2 && (d.fit == "shorter" || d.fit == "longer"))
    throw Error(r.key_path("data", "resize") + " is one side (N) with fit = \"" + d.fit + "\"");
  if (d.fit.empty() && !d.resize.empty())
    throw Error(r.key_path("data", "resize") + " needs fit (shorter, exact, height, longer or letterbox)");
  d.multiple = r.get<std::int64_t>(*t, "data", "multiple", d.multiple, "an integer");
  if (d.multiple < 1 || d.multiple > 4096) throw Error(r.key_path("data", "multiple") + " must be 1 to 4096");
  d.pad_value = r.get<double>(*t, "data", "pad_value", d.pad_value, "a number (a pixel value, 0 to 255)");
  d.antialias = r.get<bool>(*t, "data", "antialias", d.antialias, "true or false");
  d.channels = one_of("channels", d.channels, {"RGB", "BGR", "GRAY"});
  d.layout = one_of("layout", d.layout, {"auto", "NCHW", "NHWC"});
  d.scale = r.get<double>(*t, "data", "scale", d.scale, "a number (1/255 maps pixels to [0, 1])");
  if (d.scale == 0) throw Error(r.key_path("data", "scale") + " must not be 0 (every sample would be the mean)");
  d.mean = numbers("mean", d.mean);
  d.std = numbers("std", d.std);
  for (double s : d.std)
    if (s == 0) throw Error(r.key_path("data", "std") + " must not hold 0 (samples are divided by it)");
  const std::size_t channels = d.channels == "GRAY" ? 1 : 3;
  for (const auto* key : {"mean", "std"}) {
    const auto& v = std::string(key) == "mean" ? d.mean : d.std;
    if (v.size() != 1 && v.size() != channels)
      throw Error(r.key_path("data", key) + " has " + std::to_string(v.size()) + " values for " +
                  std::to_string(channels) + " channel(s) (channels = \"" + d.channels + "\"): give one or " +
                  std::to_string(channels));
  }
  d.undecodable = one_of("undecodable", d.undecodable, {"error", "skip"});
  c.data = d;
}

void read_qat(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "qat",
               {"epochs", "lr", "weight_decay", "batch_size", "count", "loss", "temperature", "seed", "tf32",
                "cache_teacher", "cuda_graph", "deterministic"});
  auto positive_int = [&](const char* key, int current, std::int64_t min) {
    const std::int64_t v = r.get<std::int64_t>(*t, "qat", key, current, "an integer");
    if (v < min || v > (1 << 30))
      throw Error(r.key_path("qat", key) + " must be " + std::to_string(min) + " to " + std::to_string(1 << 30) +
                  ", got " + std::to_string(v));
    return static_cast<int>(v);
  };
  c.qat.epochs = positive_int("epochs", c.qat.epochs, 1);
  c.qat.batch_size = positive_int("batch_size", c.qat.batch_size, 1);
  c.qat.count = positive_int("count", c.qat.count, 0);
  c.qat.lr = r.get<double>(*t, "qat", "lr", c.qat.lr, "a number");
  if (!(c.qat.lr > 0)) throw Error(r.key_path("qat", "lr") + " must be > 0");
  c.qat.weight_decay = r.get<double>(*t, "qat", "weight_decay", c.qat.weight_decay, "a number");
  if (!(c.qat.weight_decay >= 0)) throw Error(r.key_path("qat", "weight_decay") + " must be >= 0");
  c.qat.loss = r.get<std::string>(*t, "qat", "loss", c.qat.loss, "a string");
  if (c.qat.loss != "mse" && c.qat.loss != "kl") throw Error(r.key_path("qat", "loss") + " must be \"mse\" or \"kl\"");
  c.qat.temperature = r.get<double>(*t, "qat", "temperature", c.qat.temperature, "a number");
  if (!(c.qat.temperature > 0)) throw Error(r.key_path("qat", "temperature") + " must be > 0");
  c.qat.seed = r.get<std::int64_t>(*t, "qat", "seed", c.qat.seed, "an integer");
  c.qat.tf32 = r.get<bool>(*t, "qat", "tf32", c.qat.tf32, "true or false");
  c.qat.cache_teacher = r.get<bool>(*t, "qat", "cache_teacher", c.qat.cache_teacher, "true or false");
  c.qat.cuda_graph = r.get<bool>(*t, "qat", "cuda_graph", c.qat.cuda_graph, "true or false");
  c.qat.deterministic = r.get<bool>(*t, "qat", "deterministic", c.qat.deterministic, "true or false");
}

void read_target(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "target",
               {"metric", "value", "fallback", "max_fallback_layers", "holdout", "strict", "outputs", "ctc_blank"});
  TargetConfig& tc = c.target.emplace();
  tc.metric = r.get<std::string>(*t, "target", "metric", tc.metric, "a string");
  if (tc.metric != "cosine" && tc.metric != "sqnr" && tc.metric != "mse" && tc.metric != "maxabs" &&
      tc.metric != "argmax-agreement" && tc.metric != "ctc-agreement" && tc.metric != "top1-drop")
    throw Error(r.key_path("target", "metric") +
                " must be \"cosine\", \"sqnr\", \"mse\", \"maxabs\", \"argmax-agreement\", \"ctc-agreement\" or "
                "\"top1-drop\", "
                "got '" +
                printable(tc.metric, 40) + "'");
  tc.has_value = t->get("value") != nullptr;
  tc.value = r.get<double>(*t, "target", "value", tc.value, "a number");
  if (t->get("fallback")) tc.fallback = r.strings(*t, "target", "fallback");
  for (const auto& f : tc.fallback)
    if (f != "range" && f != "per-channel" && f != "int16" && f != "float")
      throw Error(r.key_path("target", "fallback") + ": '" + printable(f, 40) +
                  "' is not a precision or remedy; use any of \"range\" (another range for the layer's "
                  "activations), \"per-channel\" (per-channel weights), \"int16\" (16-bit activations), "
                  "\"float\"");
  if (tc.fallback.empty()) throw Error(r.key_path("target", "fallback") + " needs at least one remedy");
  tc.max_fallback_layers =
      r.get<std::int64_t>(*t, "target", "max_fallback_layers", tc.max_fallback_layers, "an integer");
  if (tc.max_fallback_layers < 0 && t->get("max_fallback_layers"))
    throw Error(r.key_path("target", "max_fallback_layers") + " must be 0 or more");
  tc.holdout = r.get<std::int64_t>(*t, "target", "holdout", tc.holdout, "an integer");
  if (tc.holdout < 0 || tc.holdout > 100000) throw Error(r.key_path("target", "holdout") + " must be 0 to 100000");
  tc.strict = r.get<bool>(*t, "target", "strict", tc.strict, "true or false");
  if (t->get("outputs")) tc.outputs = r.strings(*t, "target", "outputs");
  tc.ctc_blank = r.get<std::int64_t>(*t, "target", "ctc_blank", tc.ctc_blank, "an integer");
  if (tc.has_value) tc.check_value(r.key_path("target", "value"));
}

void read_bit_allocation(const Reader& r, const toml::table* t, Config& c) {
  const std::string name = "bit_allocation";
  r.check_keys(*t, name, {"avg_weight_bits", "avg_activation_bits", "choices", "samples"});
  BitAllocationConfig& b = c.bit_allocation.emplace();
  if (const toml::node* n = t->get("choices")) {
    const toml::array* arr = n->as_array();
    if (!arr || arr->empty()) throw Error(r.key_path(name, "choices") + " must be a non-empty array of bit widths");
    b.choices.clear();
    for (const auto& e : *arr) {
      const auto v = e.value<std::int64_t>();
      if (!e.is_integer() || !v || *v < 2 || *v > 16)
        throw Error(r.key_path(name, "choices") + " must hold bit widths from 2 to 16");
      b.choices.push_back(static_cast<int>(*v));
    }
    std::sort(b.choices.begin(), b.choices.end());
    b.choices.erase(std::unique(b.choices.begin(), b.choices.end()), b.choices.end());
  }
  const double lo = b.choices.front(), hi = b.choices.back();
  for (const char* key : {"avg_weight_bits", "avg_activation_bits"}) {
    if (!t->get(key)) continue;
    const double v = r.get<double>(*t, name, key, 0.0, "a number");
    if (v < lo || v > hi)
      throw Error(r.key_path(name, key) + " = " + std::to_string(v) + " is outside the choices (" +
                  std::to_string(b.choices.front()) + " to " + std::to_string(b.choices.back()) +
                  " bits); widen [bit_allocation] choices or change the target");
    (std::string(key) == "avg_weight_bits" ? b.avg_weight_bits : b.avg_activation_bits) = v;
  }
  if (!b.avg_weight_bits && !b.avg_activation_bits)
    throw Error(r.where(name) + " needs a budget: avg_weight_bits, avg_activation_bits or both");
  b.samples = r.get<std::int64_t>(*t, name, "samples", b.samples, "an integer");
  if (b.samples < 1 || b.samples > 100000) throw Error(r.key_path(name, "samples") + " must be 1 to 100000");
}

void read_plugins(const Reader& r, const toml::table* t, const std::string& source_name, Config& c) {
  r.check_keys(*t, "plugins", {"paths", "enable", "disable"});
  c.plugins.paths = r.strings(*t, "plugins", "paths");
  // Relative plugin folders are relative to the config file, not to the current directory.
  fs::path base = fs::path(source_name).parent_path();
  for (auto& p : c.plugins.paths)
    if (fs::path(p).is_relative()) p = (base / p).lexically_normal().string();
  c.plugins.enable = r.globs(*t, "plugins", "enable");
  c.plugins.disable = r.globs(*t, "plugins", "disable");
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
  // Folding the arithmetic around convolutions serves ONNX Runtime's integer kernels (and its
  // accuracy); under TensorRT's symmetric activations it cost the PP-OCRv4 recognizer 12 points
  // (docs/PASSES.md). So its default follows the backend; [schedule] sets it either way.
  for (auto& e : c.schedule)
    if (e.pass == "fuse_affine" || e.pass == "fuse_hardsigmoid") e.enabled = c.backend == "onnxruntime";
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
  if (auto* t = table("schedule")) {
    std::vector<std::string> known;
    for (const auto& e : c.schedule) known.push_back(e.pass);
    r.check_keys(*t, "schedule", known);
    for (auto& e : c.schedule) e.enabled = r.get<bool>(*t, "schedule", e.pass, e.enabled, "true or false");
  }
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
