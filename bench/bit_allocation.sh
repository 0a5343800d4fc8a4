#!/usr/bin/env bash
# Mixed precision by sensitivity ([bit_allocation]) against uniform bits at the same average, on
# the bundled Fashion-MNIST models: top-1 on the 10,000 test images, calibrated on 512 training
# images, widths chosen from 4 and 8 bits (and, for activations, 4 to 8). Prints one markdown
# table per model.
#
#   bench/bit_allocation.sh [SPARSEBIT_BINARY] [WORK_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build/bin/sparsebit}"
work="${2:-$(mktemp -d)}"
data=/usr/share/datasets/fashion-mnist
mkdir -p "$work"

config() {  # config NAME WBITS ABITS [BIT_ALLOCATION TABLE]
  cat > "$work/$1.toml" <<EOF
backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
bits = $2
observer = "minmax"
[a]
qscheme = "per-tensor-affine"
bits = $3
observer = "mse"
[calibration]
batch_size = 32
count = 512
$4
EOF
}

row() {  # row MODEL NAME LABEL: quantize, then the table row (top-1, averages, seconds)
  local start end
  start=$(date +%s.%N)
  "$bin" -q quantize "$1" -c "$work/$2.toml" --calib "$data/train-images-idx3-ubyte.gz" -o "$work/$2.onnx" \
    --report "$work/$2.json" --eval-data "$data/t10k-images-idx3-ubyte.gz" \
    --eval-labels "$data/t10k-labels-idx1-ubyte.gz" > "$work/$2.txt" 2> "$work/$2.log"
  end=$(date +%s.%N)
  /usr/bin/python3 - "$work/$2.json" "$work/$2.txt" "$3" "$(echo "$end - $start" | bc)" <<'EOF'
import json, re, sys
report, text, label, seconds = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), sys.argv[3], float(sys.argv[4])
top1 = re.search(r"simulated quantized accuracy\s+([0-9.]+)%", text).group(1)
fp32 = re.search(r"FP32 accuracy\s+([0-9.]+)%", text).group(1)
b = report.get("bit_allocation")
def average(role, key):
    if b and b[key + "_target"] is not None:
        return "%.2f" % b[key]
    slots = [s for s in report["quantized_inputs"] if s["role"] == role and s["enabled"]]
    return "%d" % slots[0]["bits"] if slots else "-"
print(f"| {label} | {average('weight', 'avg_weight_bits')} | {average('activation', 'avg_activation_bits')} | "
      f"{top1}% | {float(top1) - float(fp32):+.2f} | {seconds:.1f} |")
EOF
}

alloc() {  # alloc AVG_WEIGHT AVG_ACTIVATION [CHOICES]: the [bit_allocation] table
  printf '[bit_allocation]\nchoices = [%s]\nsamples = 64\n' "${3:-4, 8}"
  [[ $1 != - ]] && printf 'avg_weight_bits = %s\n' "$1"
  [[ $2 != - ]] && printf 'avg_activation_bits = %s\n' "$2"
  true
}

config w8a8 8 8 ""
config w4a8 4 8 ""
config w6a8 6 8 ""
config w8a6 8 6 ""
config w6a6 6 6 ""
config w5a8 5 8 ""
config alloc_w6 8 8 "$(alloc 6 -)"
config alloc_w5 8 8 "$(alloc 5 -)"
config alloc_a6 8 8 "$(alloc - 6)"
config alloc_w6a6 8 8 "$(alloc 6 6)"
config alloc_a6_fine 8 8 "$(alloc - 6 "4, 5, 6, 7, 8")"

for model in fashion_mnist_cnn fashion_mnist_mobilenet; do
  onnx="$root/examples/fashion_mnist/$model.onnx"
  echo
  echo "$model (FP32 $("$bin" -q quantize "$onnx" -c "$work/w8a8.toml" --calib "$data/train-images-idx3-ubyte.gz" \
    -o "$work/fp.onnx" --eval-data "$data/t10k-images-idx3-ubyte.gz" --eval-labels "$data/t10k-labels-idx1-ubyte.gz" 2> /dev/null |
    sed -n 's/^FP32 accuracy *//p'))"
  echo
  echo "| widths | weight bits (average) | activation bits (average) | top-1 | vs FP32 | quantize s |"
  echo "|---|---|---|---|---|---|"
  row "$onnx" w8a8 "uniform W8A8"
  row "$onnx" w4a8 "uniform W4A8"
  row "$onnx" w5a8 "uniform W5A8"
  row "$onnx" alloc_w5 "allocated, weights 5 from {4, 8}"
  row "$onnx" w6a8 "uniform W6A8"
  row "$onnx" alloc_w6 "allocated, weights 6 from {4, 8}"
  row "$onnx" w8a6 "uniform W8A6"
  row "$onnx" alloc_a6 "allocated, activations 6 from {4, 8}"
  row "$onnx" alloc_a6_fine "allocated, activations 6 from {4, 5, 6, 7, 8}"
  row "$onnx" w6a6 "uniform W6A6"
  row "$onnx" alloc_w6a6 "allocated, both 6 from {4, 8}"
done

# REAL=1: PP-OCRv4's recognizer (tests/real_models, 100 rendered test lines scored in ONNX
# Runtime against the float model): uniform 4 to 8-bit weights against 6 on average.
[[ "${REAL:-0}" == 1 ]] || exit 0
measure="$root/tests/real_models/measure.sh"
"$measure" prepare "$work/real" small > /dev/null
for spec in "u8 8 - -" "u6 6 - -" "u5 5 - -" "u4 4 - -" "a6 8 6 4,8" "a6_fine 8 6 4,5,6,7,8"; do
  set -- $spec
  config "rec_$1" "$2" 8 "$([[ $3 == - ]] || alloc "$3" - "${4//,/, }")"
  sed -i 's/^observer = "mse"/observer = "auto"/; s/^batch_size = 32/batch_size = 16/; s/^samples = 64/samples = 16/' \
    "$work/rec_$1.toml"
  "$measure" "$bin" "$work/real" rec "$work/rec_$1.toml" "$1"
done
