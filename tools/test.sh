#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test: unit, ONNX conformance, plugin host,
# CLI, ONNX Runtime agreement, install layout with out-of-tree plugins, the end-to-end example;
# then the unit suite again built with AddressSanitizer + UndefinedBehaviorSanitizer (clang), and
# each libFuzzer target, linked in that build, for SPARSEBIT_FUZZ_SECONDS (default 30) on its corpus.
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
  # clang 14, -O1 with line tables only: the sanitizers' reports keep their file:line, and clang
  # builds this tree in two thirds of gcc's time (LibTorch's headers dominate every file). The
  # same build links the libFuzzer targets below.
  cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARSEBIT_SANITIZE=ON \
    -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DSPARSEBIT_BUILD_BENCH=OFF \
    -DSPARSEBIT_REQUIRE_ORT=ON >/dev/null
  # The unit suite's binary and what it loads or runs (the plugins, the fixtures, the CLI); not
  # the Python module or the examples, which the suite does not run.
  cmake --build "$root/build-asan" -j"$(nproc)" --target sparsebit_tests
  # One process per core, each running its share of the suite (gtest's sharding), in the
  # environment ctest gives each test (tests/CMakeLists.txt): a process per test would spend
  # half the stage starting LibTorch under the sanitizers.
  shards=$(nproc)
  pids=()
  for ((i = 0; i < shards; ++i)); do
    (cd "$root/build-asan/tests" && SPARSEBIT_PLUGIN_PATH= ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 2400 ../bin/sparsebit_tests > "$root/build-asan/shard$i.log" 2>&1) &
    pids+=($!)
  done
  failed=0
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      grep -h "tests from .* ran\|PASSED" "$root/build-asan/shard$i.log" | tail -2
    else
      failed=1
      echo "-- shard $i of the sanitizer run failed; the end of build-asan/shard$i.log:"
      tail -n 200 "$root/build-asan/shard$i.log"
    fi
  done
  (( failed == 0 )) || exit 1
  echo "== fuzzing each input reader for ${SPARSEBIT_FUZZ_SECONDS:-30} s"
  SPARSEBIT_FUZZ_BUILD="$root/build-asan" "$root/scripts/fuzz.sh" all "${SPARSEBIT_FUZZ_SECONDS:-30}"
fi
