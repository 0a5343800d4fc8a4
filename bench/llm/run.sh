#!/usr/bin/env bash
# Weight-only INT4 on a byte-level language model trained here (#25's fixture): trains it once
# (cached in BUILD_DIR/bench/llm), then prints held-out perplexity per method in Sparsebit's
# simulation and in ONNX Runtime (both weight formats).
#
#   bench/llm/run.sh [--small | --gpt2] [BUILD_DIR]
#
# --small: a 141 k-parameter model trained for 150 steps (about 25 s), checked (--check): what
# CI runs. --gpt2: nanoGPT's layout (d 128, 4 blocks, fused qkv with bias, GELU, learned
# positions, untied head, opset 14, 64-byte windows), 1500 steps (about 25 minutes on 2 cores,
# seconds with SPARSEBIT_TRAIN_DEVICE=cuda), at groups of 128 and 32, checked (--check-awq): GPTQ
# and AWQ must each at most halve round to nearest's increase. Default: 1.8 M parameters (d 192,
# 4 layers), 600 steps (about 10 minutes on 2 cores).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kind=()
case "${1:-}" in --small | --gpt2) kind=("$1"); shift ;; esac
build="${1:-$root/build}"
dir="$build/bench/llm/tiny_lm${kind:+_${kind[0]#--}}"
train=("${kind[@]}")
[[ "${kind[*]}" == --gpt2 ]] && train+=(--steps 1500 --device "${SPARSEBIT_TRAIN_DEVICE:-cpu}")
[[ -f "$dir/model.onnx" ]] || /usr/bin/python3 "$root/bench/llm/make_tiny_lm.py" "$dir" "${train[@]}"
perplexity=(/usr/bin/python3 "$root/bench/llm/perplexity.py" "$dir" --build "$build")
case "${kind[*]}" in
  --small) "${perplexity[@]}" --out "$dir/results.json" --check ;;
  --gpt2) for g in 128 32; do "${perplexity[@]}" --group "$g" --out "$dir/results_g$g.json" --check-awq; done ;;
  *) "${perplexity[@]}" --out "$dir/results.json" ;;
esac
