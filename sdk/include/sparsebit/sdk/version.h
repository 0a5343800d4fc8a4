#pragma once
/// \file
/// Versions and the build fingerprint that gate plugin loading (docs in plugin.h).
///
/// Note [ABI version vs SDK version]
/// kAbiVersion and the SDK major version change together, only when a release breaks plugins
/// built before it; the host refuses any other value. Within a major version the SDK only grows
/// (Note [Capabilities] in quantizer.h): each release that adds to it bumps the minor version,
/// and a host loads plugins of its major version built against its own or any older minor.
/// sdk/abi.lock records the headers of every minor version of the major; the sdk.abi_lock test
/// fails until a change to them comes with a new minor version (or a new major);
/// sdk.only_grows_from_the_last_release compares the classes' layout with the last release's
/// headers, kept in tests/plugin_host/released/, and fixture_released_sdk is a plugin built
/// against them that this host runs (docs/PLUGINS.md, Stability).

#include <cstdint>

#if __has_include(<torch/csrc/api/include/torch/version.h>)
#include <torch/csrc/api/include/torch/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
#if __has_include(<ATen/cuda/CUDAConfig.h>)
#include <ATen/cuda/CUDAConfig.h>
#endif

namespace sparsebit::sdk {

inline constexpr std::uint32_t kAbiVersion = 18;  // 18 = SDK 1: optional roles as capabilities
inline constexpr std::uint32_t kSdkVersionMajor = 1;
inline constexpr std::uint32_t kSdkVersionMinor = 8;  // 1.8: the test kit (testing.h)

}  // namespace sparsebit::sdk

#define SPARSEBIT_STR2(x) #x
#define SPARSEBIT_STR(x) SPARSEBIT_STR2(x)

/// LibTorch major.minor the translation unit is compiled against: tensors cross the plugin
/// boundary by value, so both sides must agree on at::Tensor's layout and on ATen's operators.
#if defined(TORCH_VERSION_MAJOR)
#define SPARSEBIT_FP_TORCH SPARSEBIT_STR(TORCH_VERSION_MAJOR) "." SPARSEBIT_STR(TORCH_VERSION_MINOR)
#else
#define SPARSEBIT_FP_TORCH "unknown"
#endif

#if defined(AT_CUDA_ENABLED)
#define SPARSEBIT_FP_CUDA (AT_CUDA_ENABLED() ? 1 : 0)
#elif __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
// LibTorch 2.x no longer defines AT_CUDA_ENABLED; this header is generated only by CUDA builds.
#define SPARSEBIT_FP_CUDA 1
#else
#define SPARSEBIT_FP_CUDA 0
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define SPARSEBIT_FP_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define SPARSEBIT_FP_CXX11_ABI -1
#endif

#if defined(__clang__)
#define SPARSEBIT_FP_COMPILER "clang-" SPARSEBIT_STR(__clang_major__)
#elif defined(__GNUC__)
#define SPARSEBIT_FP_COMPILER "gcc-" SPARSEBIT_STR(__GNUC__)
#else
#define SPARSEBIT_FP_COMPILER "unknown"
#endif
