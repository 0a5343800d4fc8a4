#!/usr/bin/env bash
# Configures and builds Sparsebit (Release) into build/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEBIT_REQUIRE_ORT=ON -DSPARSEBIT_REQUIRE_PYTHON=ON >/dev/null
cmake --build "$root/build" -j"$(nproc)"
