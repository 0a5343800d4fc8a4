#pragma once
/// \file
/// The registry of everything plugins provide, and the plugin host that fills it.
///
/// Note [Plugin discovery and gates]
/// Folders are searched in this order: the config's `[plugins] paths`, the folders of
/// SPARSEBIT_PLUGIN_PATH (':'-separated), then `<libdir>/sparsebit/plugins` beside the core
/// library (the build tree has the same layout, so it works without installing). Never the
/// current directory. Every `*.so` found is opened with RTLD_NOW | RTLD_LOCAL and checked:
/// entry symbol, ABI version, descriptor size, SDK version, LibTorch version, CUDA, C++ ABI
/// flag, then the enable/disable globs, then its register function runs against a staging
/// registrar; what it registered is committed only if that succeeds and no name clashes with
/// an earlier plugin. A refused plugin is recorded with the reason and the others still load.
/// Libraries are never unloaded (objects they made may live until exit).

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/sdk/registrar.h"

namespace sparsebit {

struct PluginSearch {
  std::vector<std::string> paths;    ///< searched first, in order
  std::vector<std::string> enable;   ///< globs over plugin names; empty = all
  std::vector<std::string> disable;  ///< globs over plugin names
  bool use_environment = true;       ///< read SPARSEBIT_PLUGIN_PATH
  bool use_default_folder = true;    ///< the folder installed beside the core library
};

struct SPARSEBIT_API PluginRecord {
  enum class Status { kLoaded, kRefused, kDisabled };
  std::string file;
  Status status = Status::kRefused;
  std::string reason;  ///< why refused or disabled
  std::string gate;    ///< which check refused it ("abi_version", "torch_version", ...)
  std::string name, version, sdk_version, torch_version, compiler;
  int cuda = -1, cxx11_abi = -1;
  std::vector<std::string> registered;  ///< "op:Conv", "observer:minmax", ...
  const char* status_name() const;
};

template <class Factory>
struct Entry {
  Factory factory;
  std::string plugin;  ///< name of the plugin that registered it
  std::string file;
};

class SPARSEBIT_API Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// Discovers and loads plugins; safe to call once per Registry.
  void load(const PluginSearch& search);
  /// Loads one library file (tests, embedding). Returns its record (also kept in plugins()).
  const PluginRecord& load_file(const std::string& path, const PluginSearch& filter = {});

  const std::vector<PluginRecord>& plugins() const { return plugins_; }
  /// The folders that load() searched, in order.
  const std::vector<std::string>& searched_folders() const { return searched_; }

  const Entry<OpFactory>* op(const std::string& op_type, const std::string& domain) const;
  const Entry<ObserverFactory>* observer(const std::string& name) const;
  const Entry<QuantizerFactory>* quantizer(const std::string& name) const;
  const Entry<PassFactory>* pass(const std::string& name) const;
  /// The default-schedule place pass `name` was registered with, or nullptr (Note [Pass schedule]).
  const PassSchedule* pass_schedule(const std::string& name) const;
  const Entry<SparserFactory>* sparser(const std::string& name) const;
  const Entry<BackendFactory>* backend(const std::string& name) const;
  /// The traits registered with op `op_type` of `domain` (Note [Op traits]), or nullptr. They
  /// may be kept after the registry is gone: plugin libraries stay loaded for the process.
  std::shared_ptr<const OpTraits> op_traits(const std::string& op_type, const std::string& domain) const;
  /// One trait of that op (ChannelFlow, ...), or nullptr when it does not implement it.
  template <class Trait>
  const Trait* op_trait(const std::string& op_type, const std::string& domain) const {
    return dynamic_cast<const Trait*>(op_traits(op_type, domain).get());
  }

  /// Registered names of a kind ("op", "observer", "quantizer", "pass", "sparser", "backend").
  std::vector<std::string> names(const std::string& kind) const;

  /// The folder beside the core library where installed plugins live.
  static std::string default_plugin_folder();
  /// The plugin name in the sidecar beside `library` (Note [Selection before loading]).
  static std::optional<std::string> sidecar_name(const std::string& library);

  struct Tables;  // implementation detail, public for the staging registrar
  friend class OpTraitTable;

 private:
  /// Whether enable/disable let `library` be opened; records it as disabled otherwise.
  bool selected(const std::filesystem::path& library, const PluginSearch& filter);
  std::unique_ptr<Tables> tables_;
  std::vector<PluginRecord> plugins_;
  std::vector<std::string> searched_;
};

/// The op traits of a registry (Note [Op traits]) with the plugin that registers each op, kept
/// apart from it: a QuantModel asks its ops again when it exports, when the registry it was
/// built with may be gone (plugin libraries stay loaded for the process).
class SPARSEBIT_API OpTraitTable {
 public:
  OpTraitTable() = default;
  explicit OpTraitTable(const Registry& registry);
  struct Op {
    std::string plugin;                      ///< the plugin that registers it
    std::shared_ptr<const OpTraits> traits;  ///< nullptr when it registers none
  };
  /// Op `op_type` of `domain`, or nullptr when no plugin registers it.
  const Op* find(const std::string& op_type, const std::string& domain) const;
  /// One trait of that op, or nullptr.
  template <class Trait>
  const Trait* trait(const std::string& op_type, const std::string& domain) const {
    const Op* op = find(op_type, domain);
    return op ? dynamic_cast<const Trait*>(op->traits.get()) : nullptr;
  }

 private:
  std::map<std::string, Op> ops_;  // keyed as the registry keys ops
};

/// This host's build values, compared against each plugin's descriptor.
struct HostFingerprint {
  std::string torch_version;
  int cuda;
  int cxx11_abi;
  std::string compiler;
};
SPARSEBIT_API HostFingerprint host_fingerprint();

}  // namespace sparsebit
