#!/usr/bin/env bash
# Weight-only INT4 on a byte-level language model trained here (#25's fixture): trains it once
# (cached in BUILD_DIR/bench/llm), then prints held-out perplexity per method in Sparsebit's
# simulation and in ONNX Runtime (both weight formats).
#
#   bench/llm/run.sh [--small] [BUILD_DIR]
#
# --small: a 141 k-parameter model trained for 150 steps (about 25 s), checked (--check): what
# CI runs. Default: 1.8 M parameters (d 192, 4 layers), 600 steps (about 10 minutes on 2 cores).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
small=()
[[ "${1:-}" == "--small" ]] && { small=(--small); shift; }
build="${1:-$root/build}"
dir="$build/bench/llm/tiny_lm${small:+_small}"
[[ -f "$dir/model.onnx" ]] || /usr/bin/python3 "$root/bench/llm/make_tiny_lm.py" "$dir" "${small[@]}"
check=()
[[ ${#small[@]} -gt 0 ]] && check=(--check)
/usr/bin/python3 "$root/bench/llm/perplexity.py" "$dir" --build "$build" --out "$dir/results.json" "${check[@]}"
