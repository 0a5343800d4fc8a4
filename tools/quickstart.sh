#!/usr/bin/env bash
# Installs the dependencies, builds the command and its plugins (tools/test.sh builds the rest),
# and runs the main job on the bundled model and data.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/install-deps.sh"
"$root/tools/build.sh" command_line
"$root/examples/fashion_mnist/run.sh" "$root/build/bin/sparsebit" "$root/out/fashion_mnist"
