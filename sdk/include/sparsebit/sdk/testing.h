#pragma once
/// \file
/// The SDK's test kit: what a plugin's own tests need to test the library the host will load,
/// with any test framework and nothing of Sparsebit but this SDK (header only).
///
///     sparsebit::testing::PluginUnderTest plugin(SPARSEBIT_PLUGIN_FILE);  // the built plugin
///     auto observer = plugin.observer("mean_range", spec);
///     observer->observe(x);
///     sparsebit::QParams p = observer->compute();
///     std::vector<at::Tensor> y = sparsebit::testing::OneNode("LayerScale", "com.example").run(plugin, {x, gamma});
///
/// Note [Plugin test kit]
///   A plugin is tested as it ships: PluginUnderTest opens the library file, checks its
///   descriptor as the host does (ABI version, SDK major equal and minor not newer, LibTorch
///   version, C++ ABI) and records what its registration function registers (RecordingRegistrar);
///   a name registered twice is refused, as the host refuses it. Objects are then made as the
///   host makes them: an observer or quantizer from its QSpec and options, whose keys nobody read
///   are refused; an op from one node (OneNode) in a graph of its own. sparsebit_add_plugin
///   (cmake/SparsebitPlugin.cmake) gives each file of its TESTS the plugin's path as
///   SPARSEBIT_PLUGIN_FILE, in Sparsebit's tree and out of it alike, so a plugin's tests can be
///   copied between the two unchanged. The library stays loaded until the process ends (the
///   objects it made run its code).

#include <ATen/ATen.h>
#include <dlfcn.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/observer.h"
#include "sparsebit/sdk/op.h"
#include "sparsebit/sdk/options.h"
#include "sparsebit/sdk/pass.h"
#include "sparsebit/sdk/plugin.h"
#include "sparsebit/sdk/quantizer.h"
#include "sparsebit/sdk/registrar.h"
#include "sparsebit/sdk/sparser.h"

namespace sparsebit::testing {

/// Everything a registration function registers, by kind and name (ops by "domain:op_type",
/// the default ONNX domain as "").
class RecordingRegistrar final : public Registrar {
 public:
  std::map<std::string, OpFactory> ops;
  std::map<std::string, std::shared_ptr<const OpTraits>> op_traits;
  std::map<std::string, ObserverFactory> observers;
  std::map<std::string, QuantizerFactory> quantizers;
  std::map<std::string, PassFactory> passes;
  std::map<std::string, PassSchedule> pass_schedules;
  std::map<std::string, SparserFactory> sparsers;
  std::map<std::string, BackendFactory> backends;
  std::map<std::string, KernelsFactory> kernels;

  static std::string op_key(const std::string& op_type, const std::string& domain) {
    return (domain == "ai.onnx" ? std::string() : domain) + ":" + op_type;
  }

  void add_op_factory(const std::string& op_type, const std::string& domain, OpFactory f) override {
    put(ops, "op", op_key(op_type, domain), std::move(f));
  }
  void add_observer_factory(const std::string& name, ObserverFactory f) override {
    put(observers, "observer", name, std::move(f));
  }
  void add_quantizer_factory(const std::string& name, QuantizerFactory f) override {
    put(quantizers, "quantizer", name, std::move(f));
  }
  void add_pass_factory(const std::string& name, PassFactory f) override { put(passes, "pass", name, std::move(f)); }
  void add_sparser_factory(const std::string& name, SparserFactory f) override {
    put(sparsers, "sparser", name, std::move(f));
  }
  void add_backend_factory(const std::string& name, BackendFactory f) override {
    put(backends, "backend", name, std::move(f));
  }
  void add_kernels_factory(const std::string& device, KernelsFactory f) override {
    put(kernels, "kernels", device, std::move(f));
  }
  void add_op_traits_object(const std::string& op_type, const std::string& domain,
                            std::shared_ptr<const OpTraits> traits) override {
    put(op_traits, "op traits", op_key(op_type, domain), std::move(traits));
  }
  void add_pass_schedule(const std::string& name, const PassSchedule& schedule) override {
    put(pass_schedules, "pass schedule", name, schedule);
  }

 private:
  template <class T>
  static void put(std::map<std::string, T>& table, const char* kind, const std::string& key, T value) {
    if (!table.emplace(key, std::move(value)).second)
      throw Error(std::string(kind) + " '" + key + "' is registered twice; the host refuses the plugin");
  }
};

/// Per-tensor parameters as an observer computes them: a float scale and an int32 zero point.
inline QParams per_tensor_qparams(double scale, std::int64_t zero_point = 0) {
  return {at::scalar_tensor(scale, at::kFloat), at::scalar_tensor(zero_point, at::TensorOptions().dtype(at::kInt))};
}

/// The message of the sparsebit::Error `fn` throws; empty when it throws none.
inline std::string thrown_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

/// The optional role `Role` of a plugin's object (Note [Capabilities] in quantizer.h); an Error
/// naming the role when the object has none.
template <class Role, class T>
Role& as_role(const std::unique_ptr<T>& object) {
  auto* r = dynamic_cast<Role*>(object.get());
  if (!r) throw Error(std::string("the object has no role ") + typeid(Role).name());
  return *r;
}

/// A plugin library loaded for its tests (Note [Plugin test kit]).
class PluginUnderTest {
 public:
  explicit PluginUnderTest(const std::string& path) : path_(path) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw Error("plugin '" + path + "' does not load: " + dlerror());
    using Entry = const SparsebitPluginDescriptor* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, SPARSEBIT_PLUGIN_ENTRY_SYMBOL));
    if (!entry)
      throw Error("plugin '" + path + "' exports no " SPARSEBIT_PLUGIN_ENTRY_SYMBOL ": SPARSEBIT_PLUGIN missing");
    const SparsebitPluginDescriptor& d = *entry();
    auto refuse = [&](const std::string& what, const std::string& plugin, const std::string& host) {
      throw Error("plugin '" + path + "': " + what + " " + plugin + ", this SDK's " + host +
                  "; rebuild it against this SDK");
    };
    if (d.abi_version != sdk::kAbiVersion)
      refuse("ABI version", std::to_string(d.abi_version), std::to_string(sdk::kAbiVersion));
    if (d.sdk_major != sdk::kSdkVersionMajor || d.sdk_minor > sdk::kSdkVersionMinor)
      refuse("SDK", std::to_string(d.sdk_major) + "." + std::to_string(d.sdk_minor),
             std::to_string(sdk::kSdkVersionMajor) + "." + std::to_string(sdk::kSdkVersionMinor));
    if (std::string(d.torch_version) != SPARSEBIT_FP_TORCH) refuse("LibTorch", d.torch_version, SPARSEBIT_FP_TORCH);
    if (d.cxx11_abi != SPARSEBIT_FP_CXX11_ABI)
      refuse("_GLIBCXX_USE_CXX11_ABI", std::to_string(d.cxx11_abi), std::to_string(SPARSEBIT_FP_CXX11_ABI));
    name_ = d.name;
    version_ = d.version;
    d.register_fn(registered_);
  }

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& path() const { return path_; }
  const RecordingRegistrar& registered() const { return registered_; }

  /// An observer as the host makes one for an input with `spec` and `options` (its
  /// observer_options); options nobody read are refused.
  std::unique_ptr<Observer> observer(const std::string& name, const QSpec& spec = {},
                                     const Options& options = Options("[test]")) const {
    auto made = find(registered_.observers, "observer", name)(ObserverContext{spec, options, "test tensor"});
    refuse_unread(options, "observer", name);
    return made;
  }
  std::unique_ptr<Quantizer> quantizer(const std::string& name, const QSpec& spec = {},
                                       const Options& options = Options("[test]")) const {
    auto made = find(registered_.quantizers, "quantizer", name)(QuantizerContext{spec, options, "test tensor"});
    refuse_unread(options, "quantizer", name);
    return made;
  }
  std::unique_ptr<Sparser> sparser(const std::string& name, const Options& options = Options("[test]")) const {
    auto made = find(registered_.sparsers, "sparser", name)(SparserContext{options, "[sparse]"});
    refuse_unread(options, "sparser", name);
    return made;
  }
  std::unique_ptr<Pass> pass(const std::string& name) const { return find(registered_.passes, "pass", name)(); }
  const OpFactory& op(const std::string& op_type, const std::string& domain = "") const {
    return find(registered_.ops, "op", RecordingRegistrar::op_key(op_type, domain));
  }

 private:
  template <class T>
  const T& find(const std::map<std::string, T>& table, const char* kind, const std::string& key) const {
    auto it = table.find(key);
    if (it == table.end()) throw Error("plugin '" + name_ + "' registers no " + kind + " '" + key + "'");
    return it->second;
  }
  static void refuse_unread(const Options& options, const char* kind, const std::string& name) {
    for (const auto& key : options.unused())
      throw Error(options.where() + ": key " + key + " not understood by " + kind + " '" + name + "'");
  }

  std::string path_, name_, version_;
  RecordingRegistrar registered_;
};

/// One node of an op in a graph of its own, made and run as the executor makes and runs it:
/// inputs named x0, x1, ..., outputs y0, y1, ...; inputs marked constant are initializers, as a
/// model's weights are.
class OneNode {
 public:
  explicit OneNode(std::string op_type, std::string domain = "", std::int64_t opset = 17) : opset_(opset) {
    node_.name = "node0";
    node_.op_type = std::move(op_type);
    node_.domain = std::move(domain);
  }
  OneNode& attr(const std::string& key, Attribute value) {
    node_.attributes[key] = std::move(value);
    return *this;
  }
  OneNode& name(std::string n) {
    node_.name = std::move(n);
    return *this;
  }
  OneNode& outputs(std::size_t count) {
    outputs_ = count;
    return *this;
  }
  /// Input `index` is a constant (the value run() is given for it becomes an initializer).
  OneNode& constant(std::size_t index) {
    constants_.push_back(index);
    return *this;
  }

  /// The op made for `inputs` (their values only matter for constant inputs).
  std::unique_ptr<QModule> make(const PluginUnderTest& plugin, const std::vector<at::Tensor>& inputs) {
    graph_ = Graph();
    graph_.opset_imports[node_.domain] = opset_;
    node_.inputs.clear();
    node_.outputs.clear();
    for (std::size_t i = 0; i < inputs.size(); ++i)
      node_.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
    for (std::size_t i = 0; i < outputs_; ++i) node_.outputs.push_back("y" + std::to_string(i));
    for (std::size_t i : constants_) {
      if (i >= inputs.size()) throw Error("OneNode: constant input " + std::to_string(i) + " is not given");
      graph_.initializers[node_.inputs[i]] = inputs[i];
    }
    return plugin.op(node_.op_type, node_.domain)(OpContext{node_, opset_, graph_});
  }
  /// The op's outputs for `inputs` (an undefined tensor: an omitted optional input).
  std::vector<at::Tensor> run(const PluginUnderTest& plugin, const std::vector<at::Tensor>& inputs) {
    return make(plugin, inputs)->forward(inputs);
  }
  const Node& node() const { return node_; }

 private:
  Node node_;
  Graph graph_;
  std::int64_t opset_;
  std::size_t outputs_ = 1;
  std::vector<std::size_t> constants_;
};

}  // namespace sparsebit::testing
