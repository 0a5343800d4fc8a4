#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test: unit, ONNX conformance, plugin host,
# CLI, ONNX Runtime agreement, install layout with out-of-tree plugins, the end-to-end example;
# then the unit suite again built with AddressSanitizer + UndefinedBehaviorSanitizer, and each
# libFuzzer target for SPARSEBIT_FUZZ_SECONDS (default 30) on its corpus.
# SPARSEBIT_SKIP_SANITIZERS=1 skips the sanitizer and fuzzing stages (they rebuild everything).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/install-deps.sh"
# The build, the exported test models and the sanitizer build take about 8 GB at their peak.
free_kb=$(df -Pk "$root" | awk 'NR==2 {print $4}')
if (( free_kb < 8 * 1024 * 1024 )); then
  echo "warning: $((free_kb / 1024)) MiB free under $root; the full suite needs about 8 GiB" >&2
fi
"$root/tools/build.sh"
ctest --test-dir "$root/build" --output-on-failure -j"$(nproc)" --timeout 1200
if [[ "${SPARSEBIT_SKIP_SANITIZERS:-0}" != 1 ]]; then
  echo "== the unit suite under AddressSanitizer + UndefinedBehaviorSanitizer"
  # -O1 with line tables only: the sanitizers' reports keep their file:line, and the build
  # takes half the time of -O2 -g (LibTorch's headers dominate every file).
  cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARSEBIT_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSPARSEBIT_BUILD_BENCH=OFF -DSPARSEBIT_REQUIRE_ORT=ON >/dev/null
  # The unit suite's binary and what it loads or runs (the plugins, the fixtures, the CLI); not
  # the Python module or the examples, which the suite does not run.
  cmake --build "$root/build-asan" -j"$(nproc)" --target sparsebit_tests
  ctest --test-dir "$root/build-asan" --output-on-failure -j"$(nproc)" -L unit --timeout 1200
fi
if [[ "${SPARSEBIT_SKIP_SANITIZERS:-0}" != 1 ]]; then
  echo "== fuzzing each input reader for ${SPARSEBIT_FUZZ_SECONDS:-30} s"
  "$root/scripts/fuzz.sh" all "${SPARSEBIT_FUZZ_SECONDS:-30}"
fi
