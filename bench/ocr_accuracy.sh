#!/usr/bin/env bash
# Accuracy on the OCR fixtures (examples/ocr): the text recognizer and the CRNN recognizer
# (exact-match over 200 and 1000 test lines) and the text detector (cosine of the probability map to FP32, worst and mean page, and
# IoU of the thresholded map with the text masks),
# calibrated on lines / pages of several widths rendered by lines.py / pages.py, quantized W8A8
# for ONNX Runtime (per-channel int8 weights, per-tensor int8 activations) with each observer,
# with smooth_quant, with the placement rules off or on, and with an accuracy target. Prints one
# table per fixture.
#
#   bench/ocr_accuracy.sh [SPARSEBIT_BINARY] [WORK_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build/bin/sparsebit}"
work="${2:-$(mktemp -d)}"
py=/usr/bin/python3
ocr="$root/examples/ocr"
mkdir -p "$work"

"$py" "$ocr/lines.py" "$work/lines_calib" --count 64 --seed 11
"$py" "$ocr/lines.py" "$work/lines_test" --count 1000 --seed 12 --width 192
"$py" "$ocr/pages.py" "$work/pages_calib" --count 16 --seed 21
"$py" "$ocr/pages.py" "$work/pages_test" --count 16 --seed 22 --width 192 --masks

config() {  # config NAME OBSERVER [EXTRA TOML]
  { sed "/^\[a\]/,/^\[/ s/^observer = .*/observer = \"$2\"/" "$root/configs/w8a8_onnxruntime.toml"; printf '%b\n' "${3:-}"; } \
    > "$work/$1.toml"
}

exact() {  # SIM.npy: exact-match on the first 200 test lines and on all 1000 (four times the
  # samples: half the standard error of the 200-line figure)
  "$py" - "$ocr" "$1" "$work/lines_test/labels.txt" <<'EOF'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from exact_match import exact_match
out, labels = np.load(sys.argv[2]), open(sys.argv[3]).read().split()
print("%.2f%% | %.2f%%" % (exact_match(out[:200], labels[:200]), exact_match(out, labels)))
EOF
}

cosine() {  # SIM.npy FP.npy MASK_DIR: worst and mean per-page cosine of SIM to FP, the worst over
  # the pages where FP finds text (peak > 0.5), and the IoU of SIM > 0.5 with the pages'
  # ground-truth text masks (MASK_DIR, in file order)
  "$py" - "$1" "$2" "$3" <<'EOF'
import glob, sys
import numpy as np
q = np.load(sys.argv[1]).reshape(np.load(sys.argv[1]).shape[0], -1).astype(np.float64)
f = np.load(sys.argv[2]).reshape(q.shape).astype(np.float64)
m = np.stack([np.load(p) for p in sorted(glob.glob(sys.argv[3] + "/*.npy"))]).reshape(q.shape) > 0.5
c = (q * f).sum(1) / np.sqrt((q * q).sum(1) * (f * f).sum(1))
p = q > 0.5
found = f.max(1) > 0.5
print("%.4f %.4f %.4f %.3f" % (c.min(), c.mean(), c[found].min(), (p & m).sum() / (p | m).sum()))
EOF
}

run() {  # run MODEL NAME CALIB TEST [FLAGS...]: quantizes, prints "seconds target-summary"
  local model=$1 name=$2 calib=$3 test=$4
  shift 4
  local t0=$(date +%s.%N)
  "$bin" --quiet quantize "$model" -c "$work/$name.toml" --calib "$calib" -o "$work/$name.onnx" \
    --eval-data "$test" --eval-outputs "$work/$name.sim.npy" --eval-fp32-outputs "$work/fp32.npy" \
    --report "$work/$name.json" "$@" > /dev/null 2> "$work/$name.log"
  local t1=$(date +%s.%N)
  "$py" - "$work/$name.json" "$t0" "$t1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("target")
s = "%.1f s" % (float(sys.argv[3]) - float(sys.argv[2]))
if t:
    s += " | %s %s: %s %.6g -> %.6g, %d of %d layers in %s, %d evaluations" % (
        t["target"], "reached" if t["reached"] else "NOT reached", t["target"].split(">")[0].split("<")[0],
        t["before"], t["after"], len(t["fallback_layers"]), t["quantized_layers"], t["precision"] or "-",
        t["evaluations"])
print(s)
EOF
}

for o in minmax percentile kl_histogram mse; do config "$o" "$o"; done
config smooth minmax '[schedule]\nsmooth_quant = true'
config smooth_mse mse '[schedule]\nsmooth_quant = true'
config smooth_dw minmax '[schedule]\nsmooth_quant = true\n[passes.smooth_quant]\ndepthwise = true'
config smooth_dw_pct percentile '[schedule]\nsmooth_quant = true\n[passes.smooth_quant]\ndepthwise = true'
config no_norm_rule minmax '[schedule]\nfloat_norms_and_heads = false'
config float_scores minmax '[schedule]\nfloat_attention_scores = true'

echo "## Text recognizer (examples/ocr/text_recognizer.onnx): exact-match on 200 and 1000 lines"
echo
echo "| W8A8 | exact-match, 200 lines | 1000 lines | quantize time | target |"
echo "|---|---|---|---|---|"
rec="$ocr/text_recognizer.onnx"
first=1
for name in minmax percentile kl_histogram mse smooth smooth_mse smooth_dw no_norm_rule float_scores; do
  info=$(run "$rec" "$name" "$work/lines_calib" "$work/lines_test")
  if ((first)); then
    echo "| FP32 | $(exact "$work/fp32.npy") | |"
    first=0
  fi
  echo "| $name | $(exact "$work/$name.sim.npy") | $info |"
done
for target in "sqnr>=35" "cosine>=0.999" "cosine>=0.9999"; do
  name="target_$(echo "$target" | tr -c 'a-z0-9' '_')"
  config "$name" mse
  info=$(run "$rec" "$name" "$work/lines_calib" "$work/lines_test" --target "$target")
  echo "| mse, --target \"$target\" | $(exact "$work/$name.sim.npy") | $info |"
done

echo
echo "## CRNN recognizer (examples/ocr/crnn_recognizer.onnx: CNN + two bidirectional LSTMs + CTC): exact-match on 200 and 1000 lines"
echo
echo "| W8A8 | exact-match, 200 lines | 1000 lines | quantize time |"
echo "|---|---|---|---|"
crnn="$ocr/crnn_recognizer.onnx"
cp "$root/configs/w8a8_tensorrt.toml" "$work/crnn_tensorrt.toml"  # LSTMs float, convolutions INT8
first=1
for name in minmax percentile kl_histogram mse crnn_tensorrt; do
  info=$(run "$crnn" "$name" "$work/lines_calib" "$work/lines_test")
  if ((first)); then
    echo "| FP32 | $(exact "$work/fp32.npy") | |"
    first=0
  fi
  echo "| $name | $(exact "$work/$name.sim.npy") | $info |"
done

echo
echo "## Text detector (examples/ocr/text_detector.onnx): probability-map cosine to FP32 and text IoU, 16 pages"
echo
echo "| W8A8 | worst page | mean | worst page where FP32 finds text | IoU (p > 0.5) with the text masks | quantize time | target |"
echo "|---|---|---|---|---|---|---|"
det="$ocr/text_detector.onnx"
masks="$work/pages_test/masks"
first=1
for name in minmax percentile kl_histogram mse smooth smooth_dw smooth_dw_pct no_norm_rule; do
  info=$(run "$det" "$name" "$work/pages_calib" "$work/pages_test")
  if ((first)); then
    read -r worst mean found iou < <(cosine "$work/fp32.npy" "$work/fp32.npy" "$masks")
    echo "| FP32 | | | | $iou | |"
    first=0
  fi
  read -r worst mean found iou < <(cosine "$work/$name.sim.npy" "$work/fp32.npy" "$masks")
  echo "| $name | $worst | $mean | $found | $iou | $info |"
done
for base in minmax mse smooth_dw smooth_dw_pct; do
  for target in "cosine>=0.99" "cosine>=0.999"; do
    name="det_target_${base}_$(echo "$target" | tr -c 'a-z0-9' '_')"
    case $base in
      smooth_dw) config "$name" minmax '[schedule]\nsmooth_quant = true\n[passes.smooth_quant]\ndepthwise = true' ;;
      smooth_dw_pct) config "$name" percentile '[schedule]\nsmooth_quant = true\n[passes.smooth_quant]\ndepthwise = true' ;;
      *) config "$name" "$base" ;;
    esac
    info=$(run "$det" "$name" "$work/pages_calib" "$work/pages_test" --target "$target")
    read -r worst mean found iou < <(cosine "$work/$name.sim.npy" "$work/fp32.npy" "$masks")
    echo "| $base, --target \"$target\" | $worst | $mean | $found | $iou | $info |"
  done
done
# With 16 calibration pages, keeping 4 apart costs the ranges a quarter of their data and
# measures the target on pages that need not stand for the rest; holdout = 0 measures it on the
# calibration pages themselves, all of which calibrate.
for target in "cosine>=0.995" "cosine>=0.999"; do
  name="det_target_smooth_dw_holdout0_$(echo "$target" | tr -c 'a-z0-9' '_')"
  config "$name" minmax '[schedule]\nsmooth_quant = true\n[passes.smooth_quant]\ndepthwise = true\n[target]\nholdout = 0'
  info=$(run "$det" "$name" "$work/pages_calib" "$work/pages_test" --target "$target")
  read -r worst mean found iou < <(cosine "$work/$name.sim.npy" "$work/fp32.npy" "$masks")
  echo "| smooth_dw, holdout = 0, --target \"$target\" | $worst | $mean | $found | $iou | $info |"
done
