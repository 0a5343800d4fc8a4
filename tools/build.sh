#!/usr/bin/env bash
# Configures and builds Sparsebit (Release) into build/: everything, or the targets given
# (tools/quickstart.sh builds `command_line`, the command and its plugins).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEBIT_REQUIRE_ORT=ON -DSPARSEBIT_REQUIRE_PYTHON=ON >/dev/null
cmake --build "$root/build" -j"$(nproc)" ${1:+--target "$@"}
