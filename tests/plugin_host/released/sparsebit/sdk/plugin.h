#pragma once
/// \file
/// The plugin entry point. Include this (it includes the rest of the SDK) and end one source
/// file of the plugin with
///
///     static void register_all(sparsebit::Registrar& r) {
///       r.add_op<QConv>("Conv");
///       r.add_observer<MinMaxObserver>("minmax");
///     }
///     SPARSEBIT_PLUGIN("acme.ops.conv", "1.0.0", register_all)
///
/// The macro exports one C function, `sparsebit_plugin_descriptor`, returning a constant
/// descriptor. Before running any other code of the plugin the host checks, in this order:
/// abi_version, descriptor_size, sdk_major (equal) and sdk_minor (not newer than the host),
/// torch version, CUDA, C++ ABI flag. A mismatch refuses the plugin with both values named.

#include <cstdint>

#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"
#include "sparsebit/sdk/registrar.h"
#include "sparsebit/sdk/version.h"

extern "C" {
/// Layout fixed by kAbiVersion; abi_version stays the first field forever.
struct SparsebitPluginDescriptor {
  std::uint32_t abi_version;
  std::uint32_t descriptor_size;  ///< sizeof(SparsebitPluginDescriptor) in the plugin's build
  const char* name;
  const char* version;
  std::uint32_t sdk_major;
  std::uint32_t sdk_minor;
  const char* torch_version;  ///< "major.minor" of the LibTorch headers used
  std::int32_t cuda;          ///< 1 if built against a CUDA LibTorch
  std::int32_t cxx11_abi;     ///< _GLIBCXX_USE_CXX11_ABI
  const char* compiler;       ///< informational ("gcc-12")
  void (*register_fn)(sparsebit::Registrar&);
};
}

#define SPARSEBIT_PLUGIN_ENTRY_SYMBOL "sparsebit_plugin_descriptor"

#define SPARSEBIT_PLUGIN(NAME, VERSION, REGISTER_FN)                                                                 \
  SPARSEBIT_PLUGIN_EXPORT const SparsebitPluginDescriptor* sparsebit_plugin_descriptor() {                           \
    static const SparsebitPluginDescriptor descriptor{::sparsebit::sdk::kAbiVersion,                                 \
                                                      static_cast<std::uint32_t>(sizeof(SparsebitPluginDescriptor)), \
                                                      NAME,                                                          \
                                                      VERSION,                                                       \
                                                      ::sparsebit::sdk::kSdkVersionMajor,                            \
                                                      ::sparsebit::sdk::kSdkVersionMinor,                            \
                                                      SPARSEBIT_FP_TORCH,                                            \
                                                      SPARSEBIT_FP_CUDA,                                             \
                                                      SPARSEBIT_FP_CXX11_ABI,                                        \
                                                      SPARSEBIT_FP_COMPILER,                                         \
                                                      &REGISTER_FN};                                                 \
    return &descriptor;                                                                                              \
  }
