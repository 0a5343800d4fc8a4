#!/usr/bin/env bash
# Quantizes one exported real-architecture model (W8A8, ONNX Runtime backend) and checks it
# against ONNX Runtime with check_model.mjs.
#
#   tests/models/check_model.sh SPARSEBIT_BINARY MODELS_DIR NAME [CONFIG [TAG]]
#
# MODELS_DIR/NAME is what make_models.py wrote. Results go to MODELS_DIR/NAME/result.json
# (result.TAG.json, outputs in out.TAG/, with a TAG: checks of one model that run side by side).
# The written ONNX files (a ViT-B/16 leaves ~400 MB) are removed once checked, so that the whole
# suite fits a small disk; SPARSEBIT_KEEP_TEST_OUTPUTS=1 keeps them. A failed check keeps them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$1"
dir="$2/$3"
name="$3"
config="${4:-$root/configs/w8a8_onnxruntime.toml}"
tag="${5:+.$5}"
[[ -f "$dir/model.onnx" ]] || { echo "$dir/model.onnx is missing: run tests/models/make_models.py $2 $name" >&2; exit 1; }
out="$dir/out$tag"
mkdir -p "$out"
if [[ -z "${4:-}" ]]; then
  # The parity checked here is the export's, whatever the ranges: the default config runs with
  # minmax ranges. The shipped auto observer's range selection would add its cost to every model
  # of the zoo in CI, and its finer grids let float rounding differences between ONNX Runtime and
  # LibTorch cross rounding boundaries more often where no noise floor can be measured (integer
  # token inputs cannot be perturbed; text encoder: 0.00 output steps with minmax, 0.57 with mse,
  # 1.52 with auto, limit 1). auto is checked on the real models (models.real.ppocr), the
  # Fashion-MNIST example and in its unit tests.
  sed "/^\[a\]/,/^\[/ s/^observer = .*/observer = \"minmax\"/" "$config" > "$out/minmax.toml"
  config="$out/minmax.toml"
fi

# One input: eval/000.npy. Several (the ONNX test-data layout, eval/test_data_set_*/input_<i>.pb):
# ONNX Runtime reads the first set from eval_npy/<input name>.npy.
inputs=()
if [[ -f "$dir/eval/000.npy" ]]; then
  inputs=(--input "$(cat "$dir/input_name")=$dir/eval/000.npy")
else
  for f in "$dir"/eval_npy/*.npy; do inputs+=(--input "$(basename "$f" .npy)=$f"); done
fi
# --no-latency: what is checked here is parity; speed is bench/deploy_latency.sh's.
"$bin" -q quantize "$dir/model.onnx" -c "$config" --calib "$dir/calib" -o "$out/qdq.onnx" --no-latency \
  --report "$out/report.json" --eval-data "$dir/eval" \
  --eval-outputs "$out/simulated.npy" --eval-fp32-outputs "$out/fp32.npy"
"$bin" -q simplify "$dir/model.onnx" -o "$out/simplified.onnx" > "$out/simplify.txt"
reference="$dir/model.onnx"  # what ONNX Runtime runs as the float model: the original, unless a
[[ -f "$dir/reference.onnx" ]] && reference="$dir/reference.onnx"  # fixture gives one it can run
node "$here/check_model.mjs" --name "$name" --float "$reference" --qdq "$out/qdq.onnx" \
  --simplified "$out/simplified.onnx" \
  "${inputs[@]}" --fp32 "$out/fp32.npy" --sim "$out/simulated.npy" \
  --report "$out/report.json" --result "$dir/result$tag.json"
[[ "${SPARSEBIT_KEEP_TEST_OUTPUTS:-0}" == 1 ]] || rm -f "$out/qdq.onnx" "$out/simplified.onnx"
