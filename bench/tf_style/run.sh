#!/usr/bin/env bash
# A TensorFlow-style keyword-spotting CNN (bench/tf_style/make_tf_style.py): Sparsebit's W8A8
# exports from the shipped ONNX Runtime config (its auto observer, and minmax), then side by side
# with ONNX Runtime's own MinMax quantize_static, all run in ONNX Runtime (compare_ort.py).
#
#   bench/tf_style/run.sh [BUILD_DIR [WORK_DIR]]
#
# compare_ort.py needs the onnxruntime Python package; without it here, the script stops after
# the exports and prints the command to run where it is (the GPU machine has it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
work="${2:-$build/bench/tf_style}"
python="${PYTHON:-/usr/bin/python3}"
[[ -f "$work/model.onnx" ]] || /usr/bin/python3 "$root/bench/tf_style/make_tf_style.py" "$work"
config="$root/configs/w8a8_onnxruntime.toml"
sed "/^\[a\]/,/^\[/ s/^observer = .*/observer = \"minmax\"/" "$config" > "$work/w8a8_onnxruntime_minmax.toml"
"$build/bin/sparsebit" -q quantize "$work/model.onnx" -c "$config" --calib "$work/calib" -o "$work/sparsebit_auto.onnx"
"$build/bin/sparsebit" -q quantize "$work/model.onnx" -c "$work/w8a8_onnxruntime_minmax.toml" --calib "$work/calib" \
  -o "$work/sparsebit_minmax.onnx"
"$build/bin/sparsebit" -q simplify "$work/model.onnx" -o "$work/simplified.onnx"
if "$python" -c "import onnxruntime.quantization" 2>/dev/null; then
  "$python" "$root/bench/tf_style/compare_ort.py" "$work" "$work/sparsebit_auto.onnx" "$work/sparsebit_minmax.onnx"
else
  echo "onnxruntime (Python) is not installed here; where it is, run:"
  echo "  python3 bench/tf_style/compare_ort.py $work $work/sparsebit_auto.onnx $work/sparsebit_minmax.onnx"
fi
