#pragma once
/// \file
/// What a plugin's register function receives. Registration is staged: the host commits what
/// a plugin registered only if its register function returns normally, so a plugin that throws
/// half-way leaves nothing behind.

#include <functional>
#include <memory>
#include <string>

#include "sparsebit/sdk/backend.h"
#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/observer.h"
#include "sparsebit/sdk/op.h"
#include "sparsebit/sdk/op_traits.h"
#include "sparsebit/sdk/pass.h"
#include "sparsebit/sdk/quantizer.h"
#include "sparsebit/sdk/sparser.h"

namespace sparsebit {

using OpFactory = std::function<std::unique_ptr<QModule>(const OpContext&)>;
using ObserverFactory = std::function<std::unique_ptr<Observer>(const ObserverContext&)>;
using QuantizerFactory = std::function<std::unique_ptr<Quantizer>(const QuantizerContext&)>;
using PassFactory = std::function<std::unique_ptr<Pass>()>;
using SparserFactory = std::function<std::unique_ptr<Sparser>(const SparserContext&)>;
using BackendFactory = std::function<std::unique_ptr<Backend>()>;
using KernelsFactory = std::function<std::unique_ptr<QuantKernels>()>;

class Registrar {
 public:
  virtual ~Registrar() = default;

  /// Registers T (constructible from const OpContext&) for ONNX op `op_type` of `domain`
  /// ("" = the default ONNX domain). Registry name: "op:<op_type>" or "op:<domain>:<op_type>".
  template <class T>
  void add_op(const std::string& op_type, const std::string& domain = "") {
    add_op_factory(op_type, domain,
                   [](const OpContext& c) -> std::unique_ptr<QModule> { return std::make_unique<T>(c); });
  }
  template <class T>
  void add_observer(const std::string& name) {
    add_observer_factory(name,
                         [](const ObserverContext& c) -> std::unique_ptr<Observer> { return std::make_unique<T>(c); });
  }
  template <class T>
  void add_quantizer(const std::string& name) {
    add_quantizer_factory(
        name, [](const QuantizerContext& c) -> std::unique_ptr<Quantizer> { return std::make_unique<T>(c); });
  }
  template <class T>
  void add_pass(const std::string& name) {
    add_pass_factory(name, []() -> std::unique_ptr<Pass> { return std::make_unique<T>(); });
  }
  /// A pass with its place in the default schedule (Note [Pass schedule]). Since SDK 1.6.
  template <class T>
  void add_pass(const std::string& name, const PassSchedule& schedule) {
    add_pass<T>(name);
    add_pass_schedule(name, schedule);
  }
  template <class T>
  void add_sparser(const std::string& name) {
    add_sparser_factory(name,
                        [](const SparserContext& c) -> std::unique_ptr<Sparser> { return std::make_unique<T>(c); });
  }
  template <class T>
  void add_backend(const std::string& name) {
    add_backend_factory(name, []() -> std::unique_ptr<Backend> { return std::make_unique<T>(); });
  }

  /// Traits of op `op_type` of `domain`, which this plugin also registers (Note [Op traits]);
  /// T is default-constructible. Since SDK 1.1.
  template <class T>
  void add_op_traits(const std::string& op_type, const std::string& domain = "") {
    add_op_traits_object(op_type, domain, std::make_shared<const T>());
  }

  /// Kernels for tensors on `device` (Note [Device kernels]); registry name "kernels:cuda" etc.
  template <class T>
  void add_kernels(c10::DeviceType device) {
    add_kernels_factory(c10::DeviceTypeName(device, /*lower_case=*/true),
                        []() -> std::unique_ptr<QuantKernels> { return std::make_unique<T>(); });
  }

  virtual void add_op_factory(const std::string& op_type, const std::string& domain, OpFactory f) = 0;
  virtual void add_observer_factory(const std::string& name, ObserverFactory f) = 0;
  virtual void add_quantizer_factory(const std::string& name, QuantizerFactory f) = 0;
  virtual void add_pass_factory(const std::string& name, PassFactory f) = 0;
  virtual void add_sparser_factory(const std::string& name, SparserFactory f) = 0;
  virtual void add_backend_factory(const std::string& name, BackendFactory f) = 0;
  virtual void add_kernels_factory(const std::string& device, KernelsFactory f) = 0;
  // Methods added after SDK 1.0 go at the end of the table, each with a body, so that
  // registrars written outside the host (a plugin's test double) keep compiling
  // (docs/PLUGINS.md, Stability).

  /// SDK 1.1. The host keeps the traits with the op; this body ignores them.
  virtual void add_op_traits_object(const std::string& op_type, const std::string& domain,
                                    std::shared_ptr<const OpTraits> traits) {
    (void)op_type;
    (void)domain;
    (void)traits;
  }
  /// SDK 1.6. The host keeps the schedule with the pass; this body ignores it.
  virtual void add_pass_schedule(const std::string& name, const PassSchedule& schedule) {
    (void)name;
    (void)schedule;
  }
};

}  // namespace sparsebit
