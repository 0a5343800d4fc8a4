#!/usr/bin/env bash
# FP8 against INT8 on exported models of the test zoo (tests/models/make_models.py writes them):
# each model quantized for TensorRT as W8A8 INT8 (configs/w8a8_tensorrt.toml with minmax
# activations), FP8 E4M3 (configs/fp8_tensorrt.toml) and FP8 E5M2, then the output cosine and SQNR
# against float on the held-out (or, with few samples, the calibration) samples, from the quantize
# command's own line, and the
# exported model run by ONNX Runtime on the CPU ('basic' optimizations: Note in README, FP8)
# against the simulation on the first evaluation input.
#
#   bench/fp8_accuracy.sh SPARSEBIT_BINARY MODELS_DIR MODEL...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$1"
zoo="$2"
shift 2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sed "/^\[a\]/,/^\[/ s/^observer = .*/observer = \"minmax\"/" "$root/configs/w8a8_tensorrt.toml" > "$work/int8.toml"
cp "$root/configs/fp8_tensorrt.toml" "$work/fp8_e4m3.toml"
sed 's/fp8_e4m3/fp8_e5m2/' "$root/configs/fp8_tensorrt.toml" > "$work/fp8_e5m2.toml"
echo "| model | scheme | cosine vs float | SQNR dB | max abs ONNX Runtime - simulation (relative) | quantize s |"
echo "|---|---|---:|---:|---:|---:|"
for model in "$@"; do
  dir="$zoo/$model"
  input="$(cat "$dir/input_name")"
  output=$(/usr/bin/python3 -c "import onnx; print(onnx.load('$dir/model.onnx', load_external_data=False).graph.output[0].name)")
  for scheme in int8 fp8_e4m3 fp8_e5m2; do
    start=$(date +%s.%N)
    line=$("$bin" quantize "$dir/model.onnx" -c "$work/$scheme.toml" --calib "$dir/calib" -o "$work/q.onnx" \
      --eval-data "$dir/eval" --eval-outputs "$work/sim.npy" 2>&1 | grep "quantized vs float on" || true)
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    cosine=$(sed -n 's/.*cosine \([0-9.]*\).*/\1/p' <<<"$line")
    sqnr=$(sed -n 's/.*SQNR \([-0-9.]*\) dB.*/\1/p' <<<"$line")
    node "$root/tests/ort/run_model.mjs" "$work/q.onnx" --in "$input=$dir/eval/000.npy" --out "$output=$work/ort.npy" \
      --optimization basic --threads 2 > /dev/null 2>&1 || { echo "| $model | $scheme | ONNX Runtime failed |"; continue; }
    diff=$(/usr/bin/python3 -c "
import numpy as np, sys
o = np.load('$work/ort.npy').ravel(); s = np.load('$work/sim.npy').ravel()[: o.size]
print(f'{np.abs(o - s).max() / np.abs(s).max():.2e}')")
    printf '| %s | %s | %s | %s | %s | %.1f |\n' "$model" "$scheme" "$cosine" "$sqnr" "$diff" "$seconds"
  done
done
