#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test (unit, ONNX conformance, plugin host,
# CLI, ONNX Runtime agreement, install layout, the end-to-end example).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/install-deps.sh"
"$root/tools/build.sh"
cd "$root/build"
ctest --output-on-failure -j"$(nproc)" --timeout 1200
