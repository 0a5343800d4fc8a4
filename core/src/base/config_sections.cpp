// The config's tables other than the quantization ones: [calibration], [export], [latency],
// [data], [qat], [target], [bit_allocation], [plugins] (config.cpp reads the rest and calls these).

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <regex>
#include <string>

#include "base/config_reader.h"
#include "base/glob.h"
#include "sparsebit/core/config.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::config_detail {

namespace {

namespace fs = std::filesystem;

/// Samples in one calibration batch: more than a million could never fit in memory anyway.
constexpr std::int64_t kMaxBatch = 1 << 20;

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

}  // namespace

void read_calibration(const Reader& r, const toml::table* t, Config& c) {
  r.check_keys(*t, "calibration",
               {"batch_size", "count", "device", "mode", "cuda_graph", "range_samples", "rounding_check"});
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
  c.calibration.rounding_check =
      r.get<bool>(*t, "calibration", "rounding_check", c.calibration.rounding_check, "true or false");
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

}  // namespace sparsebit::config_detail
