#include "sparsebit/core/registry.h"

#include <cstddef>
#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cctype>
#include <optional>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "base/glob.h"
#include "base/log.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit {

namespace fs = std::filesystem;

const char* PluginRecord::status_name() const {
  switch (status) {
    case Status::kLoaded: return "loaded";
    case Status::kRefused: return "refused";
    case Status::kDisabled: return "disabled";
  }
  return "?";
}

HostFingerprint host_fingerprint() {
  return {SPARSEBIT_FP_TORCH, SPARSEBIT_FP_CUDA, SPARSEBIT_FP_CXX11_ABI, SPARSEBIT_FP_COMPILER};
}

struct Registry::Tables {
  std::map<std::string, Entry<OpFactory>> ops;  // key "Conv" or "domain:Conv"
  std::map<std::string, Entry<ObserverFactory>> observers;
  std::map<std::string, Entry<QuantizerFactory>> quantizers;
  std::map<std::string, Entry<PassFactory>> passes;
  std::map<std::string, Entry<SparserFactory>> sparsers;
  std::map<std::string, Entry<BackendFactory>> backends;
  std::map<std::string, Entry<KernelsFactory>> kernels;                     // key: device type, "cuda"
  std::map<std::string, Entry<std::shared_ptr<const OpTraits>>> op_traits;  // keyed as ops
  std::map<std::string, Entry<PassSchedule>> pass_schedules;                // keyed as passes
};

namespace {

std::string op_key(const std::string& op_type, const std::string& domain) {
  return (domain.empty() || domain == "ai.onnx") ? op_type : domain + ":" + op_type;
}

// Collects one plugin's registrations; merged into the registry only if registration succeeds.
class StagingRegistrar final : public Registrar {
 public:
  Registry::Tables staged;
  std::vector<std::string> names;  // "kind:name", in registration order
  std::vector<std::string> duplicates_within;

  void add_op_factory(const std::string& op_type, const std::string& domain, OpFactory f) override {
    put(staged.ops, "op", op_key(op_type, domain), std::move(f));
  }
  void add_observer_factory(const std::string& name, ObserverFactory f) override {
    put(staged.observers, "observer", name, std::move(f));
  }
  void add_quantizer_factory(const std::string& name, QuantizerFactory f) override {
    put(staged.quantizers, "quantizer", name, std::move(f));
  }
  void add_pass_factory(const std::string& name, PassFactory f) override {
    put(staged.passes, "pass", name, std::move(f));
  }
  void add_sparser_factory(const std::string& name, SparserFactory f) override {
    put(staged.sparsers, "sparser", name, std::move(f));
  }
  void add_backend_factory(const std::string& name, BackendFactory f) override {
    put(staged.backends, "backend", name, std::move(f));
  }
  void add_kernels_factory(const std::string& device, KernelsFactory f) override {
    put(staged.kernels, "kernels", device, std::move(f));
  }
  void add_op_traits_object(const std::string& op_type, const std::string& domain,
                            std::shared_ptr<const OpTraits> traits) override {
    const std::string key = op_key(op_type, domain);
    if (!traits) throw Error("registered empty traits for op:" + key);
    if (staged.op_traits.count(key)) throw Error("registered traits for op:" + key + " twice");
    staged.op_traits.emplace(key, Entry<std::shared_ptr<const OpTraits>>{std::move(traits), {}, {}});
  }
  void add_pass_schedule(const std::string& name, const PassSchedule& schedule) override {
    if (!staged.passes.count(name))
      throw Error("registered a schedule for pass:" + name + ", which it does not register (Registrar::add_pass)");
    if (staged.pass_schedules.count(name)) throw Error("registered a schedule for pass:" + name + " twice");
    staged.pass_schedules.emplace(name, Entry<PassSchedule>{schedule, {}, {}});
  }
  /// Traits belong to an op this plugin registers: another plugin's op may change under them.
  void check_traits() const {
    for (const auto& kv : staged.op_traits)
      if (!staged.ops.count(kv.first))
        throw Error("registered traits for op:" + kv.first +
                    ", which it does not register (traits are registered with their op, by the same plugin)");
  }

 private:
  template <class M, class F>
  void put(M& table, const char* kind, const std::string& name, F f) {
    if (name.empty()) throw Error(std::string("registered a ") + kind + " with an empty name");
    if (!f) throw Error(std::string("registered ") + kind + " '" + name + "' with an empty factory");
    std::string full = std::string(kind) + ":" + name;
    if (table.count(name)) throw Error("registered " + full + " twice");
    table.emplace(name, typename M::mapped_type{std::move(f), {}, {}});
    names.push_back(full);
  }
};

// Libraries are intentionally never unloaded: objects made by a plugin may be destroyed at any
// time until process exit, and their code must still be mapped then.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}

std::vector<std::string> split_path_list(const char* value) {
  std::vector<std::string> out;
  if (!value) return out;
  std::string s(value);
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

Registry::Registry() : tables_(std::make_unique<Tables>()) {}
Registry::~Registry() = default;

std::string Registry::default_plugin_folder() {
  boost::dll::fs::error_code ec;
  auto self = boost::dll::this_line_location(ec);
  if (ec) return {};
  std::error_code fec;
  fs::path lib_dir = fs::weakly_canonical(fs::path(self.string()).parent_path(), fec);
  return (lib_dir / "sparsebit" / "plugins").string();
}

// Note [Selection before loading]
// Loading a shared object runs its ELF constructors before any gate can look at it, so plugin
// folders are trusted input and enable/disable must act before the file is opened. The name
// matched is the one in the sidecar sparsebit_add_plugin() writes beside the library
// (NAME.plugin, holding the SPARSEBIT_PLUGIN name), else the file name without ".so"; a loaded
// plugin whose descriptor disagrees with its sidecar is refused.
std::optional<std::string> Registry::sidecar_name(const std::string& library) {
  fs::path sidecar(library);
  sidecar.replace_extension(".plugin");
  std::ifstream in(sidecar);
  std::string name;
  if (!in || !std::getline(in, name)) return std::nullopt;
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  if (name.empty()) return std::nullopt;
  return name;
}

bool Registry::selected(const fs::path& library, const PluginSearch& filter) {
  if (filter.enable.empty() && filter.disable.empty()) return true;
  const auto from_sidecar = sidecar_name(library.string());
  const std::string name = from_sidecar ? *from_sidecar : library.stem().string();
  if ((filter.enable.empty() || matches_any(name, filter.enable)) && !matches_any(name, filter.disable)) return true;
  plugins_.emplace_back();
  PluginRecord& rec = plugins_.back();
  rec.file = library.string();
  rec.name = from_sidecar ? name : "";
  rec.status = PluginRecord::Status::kDisabled;
  rec.reason =
      "excluded by [plugins] enable/disable before loading (" +
      (from_sidecar ? "name '" + printable(name) + "' from its sidecar" : "file name '" + printable(name) + "'") +
      "); the file was not opened";
  logs::debug("{}", "plugin " + library.string() + " not loaded: " + rec.reason);
  return false;
}

// Note [Plugin discovery and gates]: where plugins are looked for, then each one's gates.
void Registry::load(const PluginSearch& search) {
  std::vector<std::string> folders = search.paths;
  if (search.use_environment) {
    auto env = split_path_list(std::getenv("SPARSEBIT_PLUGIN_PATH"));
    folders.insert(folders.end(), env.begin(), env.end());
  }
  if (search.use_default_folder) folders.push_back(default_plugin_folder());

  std::set<std::string> seen_files;
  for (const auto& folder : folders) {
    if (folder.empty()) continue;
    searched_.push_back(folder);
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) {
      logs::warn("{}", "plugin folder '" + folder + "' does not exist or is not a folder; skipped");
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(folder, ec)) {
      if (entry.path().extension() == ".so" && entry.is_regular_file(ec)) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());  // deterministic order inside a folder
    for (const auto& f : files) {
      std::string canonical = fs::weakly_canonical(f, ec).string();
      if (!seen_files.insert(canonical).second) continue;  // same file reached twice
      if (!selected(f, search)) continue;
      load_file(f.string(), search);
    }
  }
}

namespace {

/// A plugin refused at a gate (PluginRecord::gate) and why.
struct Refusal {
  std::string gate, why;
};

/// The descriptor's gates, in order, filling `rec` with what the descriptor says of the plugin.
/// Only abi_version may be read before it is checked (Note [ABI version vs SDK version]).
std::optional<Refusal> check_descriptor(const SparsebitPluginDescriptor& d, PluginRecord& rec,
                                        const std::string& path) {
  if (d.abi_version != sdk::kAbiVersion) {
    return Refusal{"abi_version", "ABI version " + std::to_string(d.abi_version) + ", host has " +
                                      std::to_string(sdk::kAbiVersion) + "; rebuild the plugin against this SDK"};
  }
  // SDK 1.0's descriptor ends at register_fn; later minor versions of the major may add fields
  // after it, which this host reads only up to the plugin's descriptor_size.
  constexpr std::size_t kFirstSize = offsetof(SparsebitPluginDescriptor, register_fn) + sizeof(d.register_fn);
  if (d.descriptor_size < kFirstSize || d.descriptor_size > sizeof(SparsebitPluginDescriptor)) {
    return Refusal{"descriptor_size", "descriptor size " + std::to_string(d.descriptor_size) + ", host expects " +
                                          std::to_string(kFirstSize) + " to " +
                                          std::to_string(sizeof(SparsebitPluginDescriptor))};
  }
  rec.name = d.name ? d.name : "";
  rec.version = d.version ? d.version : "";
  rec.sdk_version = std::to_string(d.sdk_major) + "." + std::to_string(d.sdk_minor);
  rec.torch_version = d.torch_version ? d.torch_version : "";
  rec.compiler = d.compiler ? d.compiler : "";
  rec.cuda = d.cuda;
  rec.cxx11_abi = d.cxx11_abi;
  if (rec.name.empty()) return Refusal{"name", "the descriptor has an empty plugin name"};
  if (auto sidecar = Registry::sidecar_name(path); sidecar && *sidecar != rec.name) {
    return Refusal{"name", "plugin '" + rec.name + "' disagrees with its sidecar file, which names '" +
                               printable(*sidecar) +
                               "' (Note [Selection before loading]); rebuild it with sparsebit_add_plugin"};
  }
  const std::string host_sdk = std::to_string(sdk::kSdkVersionMajor) + "." + std::to_string(sdk::kSdkVersionMinor);
  if (d.sdk_major != sdk::kSdkVersionMajor || d.sdk_minor > sdk::kSdkVersionMinor) {
    return Refusal{"sdk_version", "plugin '" + rec.name + "' was built against SDK " + rec.sdk_version +
                                      ", host SDK is " + host_sdk + " (same major, minor not newer)"};
  }
  const HostFingerprint host = host_fingerprint();
  if (rec.torch_version != host.torch_version) {
    return Refusal{"torch_version", "plugin '" + rec.name + "' was built against LibTorch " + rec.torch_version +
                                        ", host uses LibTorch " + host.torch_version};
  }
  if (rec.cuda != host.cuda) {
    return Refusal{"cuda", "plugin '" + rec.name + "' was built with cuda=" + std::to_string(rec.cuda) +
                               ", host has cuda=" + std::to_string(host.cuda)};
  }
  if (rec.cxx11_abi != host.cxx11_abi) {
    return Refusal{"cxx11_abi", "plugin '" + rec.name + "' was built with _GLIBCXX_USE_CXX11_ABI=" +
                                    std::to_string(rec.cxx11_abi) + ", host has " + std::to_string(host.cxx11_abi)};
  }
  if (!d.register_fn) return Refusal{"register", "the descriptor has no register function"};
  return std::nullopt;
}

/// What of `staged` is already registered in `committed` ("op:Conv is already registered by
/// plugin ..."), or "" when nothing clashes.
std::string first_clash(const Registry::Tables& committed, const Registry::Tables& staged) {
  auto clash = [](const auto& have, const auto& add, const char* kind) -> std::string {
    for (const auto& kv : add) {
      auto it = have.find(kv.first);
      if (it != have.end())
        return std::string(kind) + ":" + kv.first + " is already registered by plugin '" + it->second.plugin + "' (" +
               it->second.file + ")";
    }
    return {};
  };
  for (std::string c :
       {clash(committed.ops, staged.ops, "op"), clash(committed.observers, staged.observers, "observer"),
        clash(committed.quantizers, staged.quantizers, "quantizer"), clash(committed.passes, staged.passes, "pass"),
        clash(committed.sparsers, staged.sparsers, "sparser"), clash(committed.backends, staged.backends, "backend"),
        clash(committed.kernels, staged.kernels, "kernels")})
    if (!c.empty()) return c;
  return {};
}

/// Moves everything `staged` holds into `committed`, marked as plugin `name`'s from `file`.
void commit(Registry::Tables& committed, Registry::Tables& staged, const std::string& name, const std::string& file) {
  auto move = [&](auto& to, auto& from) {
    for (auto& kv : from) {
      kv.second.plugin = name;
      kv.second.file = file;
      to.emplace(kv.first, std::move(kv.second));
    }
  };
  move(committed.ops, staged.ops);
  move(committed.observers, staged.observers);
  move(committed.quantizers, staged.quantizers);
  move(committed.passes, staged.passes);
  move(committed.sparsers, staged.sparsers);
  move(committed.backends, staged.backends);
  move(committed.kernels, staged.kernels);
  move(committed.op_traits, staged.op_traits);
  move(committed.pass_schedules, staged.pass_schedules);
}

}  // namespace

const PluginRecord& Registry::load_file(const std::string& path, const PluginSearch& filter) {
  plugins_.emplace_back();
  PluginRecord& rec = plugins_.back();
  rec.file = path;
  auto refuse = [&](const std::string& gate, const std::string& why) -> const PluginRecord& {
    rec.status = PluginRecord::Status::kRefused;
    rec.gate = gate;
    rec.reason = why;
    logs::warn("{}", "plugin " + path + " refused (" + gate + "): " + why);
    return rec;
  };

  {
    char magic[4] = {};
    std::ifstream head(path, std::ios::binary);
    head.read(magic, 4);
    if (head.gcount() != 4 || std::memcmp(magic,
                                          "\x7f"
                                          "ELF",
                                          4) != 0)
      return refuse("load", "is not a shared library (no ELF header); remove it from the plugin folder");
  }
  boost::dll::fs::error_code ec;
  boost::dll::shared_library lib;
  lib.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec || !lib.is_loaded()) {
    return refuse("load", "cannot be loaded: " + ec.message() +
                              " (is it a shared object built for this platform, with its "
                              "dependencies on the library path?)");
  }
  if (!lib.has(SPARSEBIT_PLUGIN_ENTRY_SYMBOL)) {
    return refuse("entry_symbol", std::string("has no entry symbol '") + SPARSEBIT_PLUGIN_ENTRY_SYMBOL +
                                      "'; a plugin must end one source file with SPARSEBIT_PLUGIN(...)");
  }
  auto entry = lib.get<const SparsebitPluginDescriptor*()>(SPARSEBIT_PLUGIN_ENTRY_SYMBOL);
  const SparsebitPluginDescriptor* d = entry();
  if (!d) return refuse("descriptor", "the entry point returned no descriptor");

  if (auto refused = check_descriptor(*d, rec, path)) return refuse(refused->gate, refused->why);

  for (const auto& other : plugins_) {
    if (&other != &rec && other.status == PluginRecord::Status::kLoaded && other.name == rec.name) {
      return refuse("duplicate", "plugin name '" + rec.name + "' is already provided by " + other.file);
    }
  }
  // By its name; a plugin without a sidecar also by the file name that selected it.
  std::vector<std::string> names = {rec.name};
  if (!sidecar_name(path)) names.push_back(fs::path(path).stem().string());
  const bool enabled = filter.enable.empty() || std::any_of(names.begin(), names.end(), [&](const std::string& n) {
                         return matches_any(n, filter.enable);
                       });
  const bool disabled =
      std::any_of(names.begin(), names.end(), [&](const std::string& n) { return matches_any(n, filter.disable); });
  if (!enabled || disabled) {
    rec.status = PluginRecord::Status::kDisabled;
    rec.reason = "excluded by [plugins] enable/disable";
    logs::debug("{}", "plugin '" + rec.name + "' (" + path + ") disabled by config");
    return rec;
  }

  StagingRegistrar staging;
  try {
    d->register_fn(staging);
    staging.check_traits();
  } catch (const std::exception& e) {
    return refuse("register", "plugin '" + rec.name + "': its register function threw: " + e.what());
  } catch (...) {
    return refuse("register", "plugin '" + rec.name + "': its register function threw a non-standard exception");
  }

  if (std::string c = first_clash(*tables_, staging.staged); !c.empty())
    return refuse("duplicate", "plugin '" + rec.name + "' (" + path + "): " + c);
  // Kernels are made now, so a plugin whose kernels cannot start is refused like any other.
  std::vector<std::pair<c10::DeviceType, std::shared_ptr<QuantKernels>>> kernels;
  for (const auto& kv : staging.staged.kernels) {
    try {
      kernels.emplace_back(c10::Device(kv.first).type(), std::shared_ptr<QuantKernels>(kv.second.factory()));
    } catch (const std::exception& e) {
      return refuse("register",
                    "plugin '" + rec.name + "': its kernels for '" + kv.first + "' failed to start: " + e.what());
    }
  }
  commit(*tables_, staging.staged, rec.name, path);
  for (auto& [device, k] : kernels) install_quant_kernels(device, std::move(k), rec.name);
  rec.registered = std::move(staging.names);
  rec.status = PluginRecord::Status::kLoaded;
  loaded_libraries().push_back(std::move(lib));
  logs::debug("{}", "loaded plugin '" + rec.name + "' " + rec.version + " from " + path);
  return rec;
}

template <class M>
static const typename M::mapped_type* lookup(const M& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

const Entry<OpFactory>* Registry::op(const std::string& op_type, const std::string& domain) const {
  return lookup(tables_->ops, op_key(op_type, domain));
}
const Entry<ObserverFactory>* Registry::observer(const std::string& n) const { return lookup(tables_->observers, n); }
const Entry<QuantizerFactory>* Registry::quantizer(const std::string& n) const {
  return lookup(tables_->quantizers, n);
}
const Entry<PassFactory>* Registry::pass(const std::string& n) const { return lookup(tables_->passes, n); }
const PassSchedule* Registry::pass_schedule(const std::string& n) const {
  const auto* e = lookup(tables_->pass_schedules, n);
  return e ? &e->factory : nullptr;
}
const Entry<SparserFactory>* Registry::sparser(const std::string& n) const { return lookup(tables_->sparsers, n); }
const Entry<BackendFactory>* Registry::backend(const std::string& n) const { return lookup(tables_->backends, n); }
std::shared_ptr<const OpTraits> Registry::op_traits(const std::string& op_type, const std::string& domain) const {
  const auto* e = lookup(tables_->op_traits, op_key(op_type, domain));
  return e ? e->factory : nullptr;
}

OpTraitTable::OpTraitTable(const Registry& registry) {
  for (const auto& [key, entry] : registry.tables_->ops) {
    const auto* traits = lookup(registry.tables_->op_traits, key);
    ops_.emplace(key, Op{entry.plugin, traits ? traits->factory : nullptr});
  }
}

const OpTraitTable::Op* OpTraitTable::find(const std::string& op_type, const std::string& domain) const {
  auto it = ops_.find(op_key(op_type, domain));
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::names(const std::string& kind) const {
  std::vector<std::string> out;
  auto keys = [&](const auto& m) {
    for (auto& kv : m) out.push_back(kv.first);
  };
  if (kind == "op") keys(tables_->ops);
  else if (kind == "observer") keys(tables_->observers);
  else if (kind == "quantizer") keys(tables_->quantizers);
  else if (kind == "pass") keys(tables_->passes);
  else if (kind == "sparser") keys(tables_->sparsers);
  else if (kind == "backend") keys(tables_->backends);
  else if (kind == "kernels") keys(tables_->kernels);
  return out;
}

}  // namespace sparsebit
