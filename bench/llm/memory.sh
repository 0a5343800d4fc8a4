#!/usr/bin/env bash
# Peak host memory of weight-only quantization against the model's weight size: a decoder of
# the given shape (make_tiny_lm.py --shape, one training step: memory does not depend on the
# values) quantized to INT4 g128 by `sparsebit quantize` with rtn (streaming: weight-only reads
# no data) and gptq (asym, layer by layer), each process's peak RSS (/usr/bin/time) less the
# baseline measured in the same run: the peak of `sparsebit plugins`, which loads LibTorch and
# every plugin and nothing else. Each model is measured in one file and with its weights in an
# external data file, which Sparsebit maps and holds about one layer at a time (Note [Mapped
# weights] in core/src/base/mapped_file.h).
#
#   bench/llm/memory.sh [BUILD_DIR] [--shape D,LAYERS,HEADS,FF] [--check RTN_LIMIT,GPTQ_LIMIT]
#                       [--check-external LIMIT] [--quantizers rtn,gptq] [--with-rounding-check]
#
# Prints (peak - baseline) / weight bytes and the wall seconds per quantizer and layout (and,
# with awq and gptq both measured, AWQ's time over GPTQ's); --check fails when an
# in-file run exceeds its limit, --check-external when an external-data run exceeds LIMIT;
# --quantizers measures only those (rtn, gptq, awq; CI: gptq, the one closest to its limits); awq
# is held to gptq's limit. The quantizers are measured alone ([calibration] rounding_check =
# false); --with-rounding-check adds the check against round to nearest that weight-only runs
# make by default (docs/WEIGHT_ONLY.md), which holds a rounded model beside the solved one.
# GPTQ adds one layer's Hessian work (K x K, up to three copies) on top of what rtn holds,
# which weighs more the smaller the model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build"
shape="768,6,12,3072"
limit=""
limit_ext=""
rounding_check=false
quantizers="rtn,gptq"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shape) shape="$2"; shift 2 ;;
    --check) limit="$2"; shift 2 ;;
    --check-external) limit_ext="$2"; shift 2 ;;
    --with-rounding-check) rounding_check=true; shift ;;
    --quantizers) quantizers="$2"; shift 2 ;;
    *) build="$1"; shift ;;
  esac
done
bin="$build/bin/sparsebit"
work="$build/bench/llm/memory_${shape//,/_}"
mkdir -p "$work"
[[ -f "$work/lm/model.onnx" ]] || /usr/bin/python3 "$root/bench/llm/make_tiny_lm.py" "$work/lm" --steps 1 --shape "$shape" > "$work/make.log"
# "peak KB" and "wall seconds" of one command
measure() { /usr/bin/time -f "%M %e" -o "$work/time" "$@" > /dev/null 2> "$work/stderr" || { cat "$work/stderr"; exit 1; }; cat "$work/time"; }
base=$(measure "$bin" plugins | cut -d' ' -f1)
weights=$(/usr/bin/python3 - "$work/lm/model.onnx" <<'PY'
import sys, onnx
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
print(sum(numpy_helper.to_array(t).nbytes for t in m.graph.initializer))
PY
)
[[ -f "$work/ext/model.onnx.data" ]] || /usr/bin/python3 - "$work/lm/model.onnx" "$work/ext" <<'PY'
import os, sys, onnx
os.makedirs(sys.argv[2], exist_ok=True)
onnx.save_model(onnx.load(sys.argv[1]), os.path.join(sys.argv[2], "model.onnx"), save_as_external_data=True,
                all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
PY
status=0
printf 'model: %s parameters bytes %d (shape %s); baseline (sparsebit plugins) %d MiB\n' \
  "$(/usr/bin/python3 -c "import json;print(json.load(open('$work/lm/info.json'))['parameters'])")" "$weights" "$shape" $((base / 1024))
echo "| quantizer | mode | weights | peak MiB | (peak - baseline) / weights | seconds |"
echo "|---|---|---|---:|---:|---:|"
declare -A seconds
for layout in in-file external; do
  model="$work/lm/model.onnx"
  [[ $layout == external ]] && model="$work/ext/model.onnx"
  for q in ${quantizers//,/ }; do
    mode=streaming scheme=per-group-symmetric quantizer=$q extra=""
    [[ $q == gptq ]] && mode=asym
    # awq: configs/w4_awq.toml's method (the pass, then round to nearest on uint4 with zero points).
    [[ $q == awq ]] && scheme=per-group-affine quantizer=rtn extra=$'[schedule]\nawq = true\n'
    printf '[w]\nqscheme = "%s"\nbits = 4\ngroup_size = 128\nquantizer = "%s"\n[calibration]\nbatch_size = 8\ncount = 8\nmode = "%s"\nrounding_check = %s\n%s' \
      "$scheme" "$quantizer" "$mode" "$rounding_check" "$extra" > "$work/$q.toml"
    read -r kb s < <(measure "$bin" -q quantize "$model" -c "$work/$q.toml" --calib "$work/lm/calib" \
      -o "$work/out_${q}_$layout.onnx")
    seconds[$q,$layout]=$s
    ratio=$(python3 -c "print(f'{($kb - $base) * 1024 / $weights:.2f}')")
    echo "| $q | $mode | $layout | $((kb / 1024)) | $ratio | $s |"
    bound="${limit%,*}"
    [[ $q != rtn ]] && bound="${limit#*,}"
    [[ $layout == external ]] && bound="$limit_ext"
    if [[ -n "$bound" ]] && python3 -c "import sys; sys.exit(0 if $ratio > $bound else 1)"; then
      echo "check failed: $q ($layout) peaks at $ratio times the weights (limit $bound)"
      status=1
    fi
  done
done
if [[ -n "${seconds[awq,in-file]:-}" && -n "${seconds[gptq,in-file]:-}" ]]; then
  python3 -c "print(f'AWQ time / GPTQ time: in-file {${seconds[awq,in-file]} / ${seconds[gptq,in-file]}:.2f}x, external {${seconds[awq,external]} / ${seconds[gptq,external]}:.2f}x')"
fi
for q in ${quantizers//,/ }; do  # the same weights give the same file, mapped or read
  cmp -s "$work/out_${q}_in-file.onnx" "$work/out_${q}_external.onnx" ||
    { echo "check failed: $q's export differs between the two layouts"; status=1; }
done
[[ ( -n "$limit" || -n "$limit_ext" ) && $status == 0 ]] && echo "check passed"
exit $status
