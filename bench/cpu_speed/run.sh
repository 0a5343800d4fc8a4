#!/usr/bin/env bash
# CPU calibration cost against ONNX Runtime's own FP32 inference over the same samples, both
# timed as whole processes (wall seconds and peak RSS from /usr/bin/time), in one run:
#   ORT FP32 (bench/cpu_speed/ort_fp32.mjs), `sparsebit quantize` with minmax activations
#   (configs/w8a8_onnxruntime.toml) and with kl_histogram activations (the same, [a] observer
#   = "kl_histogram"). Targets (#23): minmax <= 2.0x ORT, kl_histogram <= 3.0x ORT, peak RSS
#   under 1 GB for models of up to 25 M parameters at 64 samples.
#
#   bench/cpu_speed/run.sh [--reduced] [BUILD_DIR]
#
# Full: resnet18, resnet50, mobilenet_v2, vit_b_16 (tests/models/make_models.py, random
# weights) on 64 random images, the bundled OCR recognizer on 64 rendered lines and detector on
# 16 rendered 320-wide pages, then `sparsebit profile --samples 4` on a 261-node
# segmentation-style detector (make_detector.py). --reduced (CI): the OCR recognizer on 16 lines and the detector
# on 4 pages. Prints one table row per model; numbers go to bench/RESULTS.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
reduced=0
[[ "${1:-}" == "--reduced" ]] && { reduced=1; shift; }
build="${1:-$root/build}"
bin="$build/bin/sparsebit"
work="$build/bench/cpu_speed"
mkdir -p "$work"
py=/usr/bin/python3

kl="$work/w8a8_kl_histogram.toml"
sed '/^\[a\]/,/^\[/ s/^observer = "[a-z_]*"/observer = "kl_histogram"/' "$root/configs/w8a8_onnxruntime.toml" > "$kl"
grep -q 'observer = "kl_histogram"' "$kl" || { echo "could not make the kl_histogram config" >&2; exit 1; }

# model path, input kind, sample count
cases=()
if [[ $reduced == 1 ]]; then
  cases+=("ocr_recognizer lines 16" "ocr_detector pages 4")
else
  for m in resnet18 resnet50 mobilenet_v2 vit_b_16; do cases+=("$m images 64"); done
  cases+=("ocr_recognizer lines 64" "ocr_detector pages 16")
fi

model_of() {
  case "$1" in
    ocr_recognizer) echo "$root/examples/ocr/text_recognizer.onnx" ;;
    ocr_detector) echo "$root/examples/ocr/text_detector.onnx" ;;
    *)
      local dir="$build/tests/models"
      [[ -f "$dir/$1/model.onnx" ]] || $py "$root/tests/models/make_models.py" "$dir" "$1" >&2
      echo "$dir/$1/model.onnx" ;;
  esac
}

# Runs a command, prints "seconds peak_MiB".
measure() {
  local log="$work/time.txt"
  /usr/bin/time -f "%e %M" -o "$log" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log" >&2; return 1; }
  awk '{ printf "%.2f %.0f\n", $1, $2 / 1024 }' "$log"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(grep -o -m1 'avx512_vnni' /proc/cpuinfo || echo 'no VNNI')"
printf "| %-16s | %7s | %9s | %9s | %6s | %9s | %6s | %8s | %8s | %8s |\n" model samples "ORT FP32 s" "minmax s" ratio "kl s" ratio "ORT MiB" "mm MiB" "kl MiB"
for c in "${cases[@]}"; do
  read -r name kind count <<< "$c"
  model="$(model_of "$name")"
  data="$work/data_${kind}_$count"
  [[ -d "$data" ]] || $py "$root/bench/cpu_speed/make_inputs.py" "$kind" "$count" "$data"
  read -r ort_s ort_m < <(measure node "$root/bench/cpu_speed/ort_fp32.mjs" "$model" "$data" --count "$count")
  read -r mm_s mm_m < <(measure "$bin" -q quantize "$model" -c "$root/configs/w8a8_onnxruntime.toml" --calib "$data" -o "$work/out.onnx")
  read -r kl_s kl_m < <(measure "$bin" -q quantize "$model" -c "$kl" --calib "$data" -o "$work/out.onnx")
  printf "| %-16s | %7s | %9s | %9s | %6.2f | %9s | %6.2f | %8s | %8s | %8s |\n" "$name" "$count" "$ort_s" "$mm_s" \
    "$(awk "BEGIN { print $mm_s / $ort_s }")" "$kl_s" "$(awk "BEGIN { print $kl_s / $ort_s }")" "$ort_m" "$mm_m" "$kl_m"
done
rm -f "$work/out.onnx" "$work/out.onnx.data"

# Every histogram observer against minmax on the same data (target: at most 1.5x minmax).
if [[ $reduced == 0 ]]; then
  for name in resnet50 mobilenet_v2; do
    model="$(model_of "$name")"
    data="$work/data_images_64"
    mm="$work/w8a8_minmax.toml"
    sed '/^\[a\]/,/^\[/ s/^observer = "[a-z_]*"/observer = "minmax"/' "$root/configs/w8a8_onnxruntime.toml" > "$mm"
    read -r mm_s _ < <(measure "$bin" -q quantize "$model" -c "$mm" --calib "$data" -o "$work/out.onnx")
    line="$name: minmax $mm_s s"
    for obs in auto kl_histogram percentile mse aciq; do
      cfg="$work/w8a8_$obs.toml"
      sed '/^\[a\]/,/^\[/ s/^observer = "[a-z_]*"/observer = "'"$obs"'"/' "$root/configs/w8a8_onnxruntime.toml" > "$cfg"
      read -r s _ < <(measure "$bin" -q quantize "$model" -c "$cfg" --calib "$data" -o "$work/out.onnx")
      line+=", $obs $s s ($(awk "BEGIN { printf \"%.2f\", $s / $mm_s }")x)"
    done
    echo "$line"
  done
  rm -f "$work/out.onnx"
fi

# The profiler's single-layer view on a segmentation-style detector (target: under 2 minutes).
if [[ $reduced == 0 ]]; then
  det="$work/deeplabv3_mobilenet_v3.onnx"
  [[ -f "$det" ]] || $py "$root/bench/cpu_speed/make_detector.py" "$det" "$work/data_det_4" 4 > /dev/null 2>&1
  read -r prof_s prof_m < <(measure "$bin" -q profile "$det" -c "$root/configs/w8a8_onnxruntime.toml" \
    --calib "$work/data_det_4" --samples 4 --mode single -o "$work/profile")
  echo "profile --samples 4 --mode single, DeepLabV3-MobileNetV3 320x320 (261 nodes): $prof_s s, $prof_m MiB"
fi
