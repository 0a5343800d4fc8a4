#!/usr/bin/env bash
# Builds Sparsebit on a GPU machine against the CUDA LibTorch of its PyTorch, where no package
# registry is reachable. The libraries that machine lacks (ONNX's C++ library, TOML++, stb) come
# as Debian 12 .deb files fetched beforehand on a machine that has the registry:
#
#   mkdir -p .device-debs && (cd .device-debs && apt-get download \
#       libonnx-dev libonnx1 libonnxifi libtomlplusplus-dev libtomlplusplus3 libgloo-dev libstb-dev libstb0)
#
# and are unpacked (not installed) into BUILD_DIR/deps. See docs/GPU.md.
#
#   scripts/device-build.sh [BUILD_DIR] [DEBS_DIR]     (defaults: build-gpu, .device-debs)
#
# Environment: PYTHON (default: python3) is the Python whose torch provides LibTorch;
# JOBS (default: all cores); SPARSEBIT_CMAKE_ARGS adds CMake options; TARGETS (default: all)
# builds only these targets, e.g. "sparsebit sparsebit_gpu_training_tests".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Absolute: CMake reads a relative CMAKE_PREFIX_PATH from the build folder, not from here.
build="$(realpath -m "${1:-$root/build-gpu}")"
debs="$(realpath -m "${2:-$root/.device-debs}")"
python="${PYTHON:-python3}"
jobs="${JOBS:-$(nproc)}"

torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
cuda="$("$python" -c 'import torch; print(torch.version.cuda or "")')"
[[ -n "$cuda" ]] || echo "warning: $python's torch has no CUDA; building a CPU-only tree" >&2

deps="$build/deps"
mkdir -p "$deps"
shopt -s nullglob
packages=("$debs"/*.deb)
if ((${#packages[@]} == 0)); then
  echo "no .deb files in $debs: fetch them as the header of $0 says" >&2
  exit 1
fi
for deb in "${packages[@]}"; do dpkg-deb -x "$deb" "$deps"; done
# Debian's CMake package files name the multiarch folder; the unpacked prefix keeps it.
multiarch="$deps/usr/lib/x86_64-linux-gnu"

# LibTorch's include folder carries protobuf and fmt headers of other versions than the system
# libraries ONNX and spdlog link: links to the system's are searched first.
prefer="$build/system-include"
mkdir -p "$prefer"
for d in google fmt; do [[ -d /usr/include/$d ]] && ln -sfn "/usr/include/$d" "$prefer/$d"; done
# PyTorch's wheels ship c10d's Gloo process group header but not the gloo headers it includes.
torch_include="$(dirname "$(dirname "$torch_prefix")")/include"
if [[ ! -d "$torch_include/gloo" && -d "$deps/usr/include/gloo" ]]; then ln -sfn "$deps/usr/include/gloo" "$prefer/gloo"; fi

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr;$multiarch/cmake" \
  -DSPARSEBIT_PREFER_INCLUDES="$prefer" \
  -DCMAKE_BUILD_RPATH="$multiarch" \
  ${SPARSEBIT_CMAKE_ARGS:-}
# shellcheck disable=SC2086 # TARGETS is a list
cmake --build "$build" -j "$jobs" ${TARGETS:+--target $TARGETS}
echo "built $build (LibTorch from $torch_prefix, CUDA ${cuda:-none})"
