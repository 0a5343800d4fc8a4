#pragma once
/// \file
/// Versions and the build fingerprint that gate plugin loading (docs in plugin.h).
///
/// Note [ABI version vs SDK version]
/// kAbiVersion names one exact state of the public SDK headers; the host refuses any other value.
/// sdk/abi.lock holds it with a hash of these headers, and the sdk.abi_lock test fails until both
/// are bumped together after any change other than comments (docs/PLUGINS.md, Stability). The
/// SDK minor version grows with each bump; a host accepts its own major version and any minor
/// version up to its own.

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

inline constexpr std::uint32_t kAbiVersion = 17;  // 17: Observer::candidates (range selection)
inline constexpr std::uint32_t kSdkVersionMajor = 0;
inline constexpr std::uint32_t kSdkVersionMinor = 17;

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
