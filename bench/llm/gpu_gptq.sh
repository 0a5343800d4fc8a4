#!/usr/bin/env bash
# GPTQ on the GPU against the same run on the CPUs, one machine: a decoder of the shape given
# (make_tiny_lm.py --shape, a few training steps: the timing does not depend on the weights'
# values), quantized with configs/w4_gptq.toml by `sparsebit quantize --device cuda` and
# `--device cpu`; prints wall times, peak host memory and the largest per-layer difference of the
# output MSEs the two reports give. Needs a CUDA build (scripts/device-build.sh).
#   bench/llm/gpu_gptq.sh SPARSEBIT_BINARY WORK_DIR [D,LAYERS,HEADS,FF]
#
# Environment: ARCH=llama for Llama's layout (make_tiny_lm.py --arch; random weights);
# DEVICES (default "cuda cpu"; "cudaxN" runs `--device cuda --nproc N`: N GPUs, Hessians merged
# across them, docs/DISTRIBUTED.md); ORT_RTN=1 also times round to nearest into MatMulNBits by
# ONNX Runtime's MatMulNBitsQuantizer (Python onnxruntime) and by Sparsebit on the same model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$1"
work="$2"
shape="${3:-1024,8,16,4096}"
python="${PYTHON:-python3}"
mkdir -p "$work"
devices="${DEVICES:-cuda cpu}"
if [[ ! -f "$work/lm/model.onnx" ]]; then
  /usr/bin/time -f "%e %M" -o "$work/time_make" "$python" "$root/bench/llm/make_tiny_lm.py" "$work/lm" --steps 0 \
    --shape "$shape" --arch "${ARCH:-gpt}" > "$work/make.log"
  echo "model made in $(cut -d' ' -f1 "$work/time_make") s; $(du -sh "$work/lm" | cut -f1) on disk"
fi
for dev in $devices; do
  args=(--device "$dev")
  [[ $dev == cudax* ]] && args=(--device cuda --nproc "${dev#cudax}")
  /usr/bin/time -f "%e %M" -o "$work/time_$dev" "$bin" -q quantize "$work/lm/model.onnx" -c "$root/configs/w4_gptq.toml" \
    --calib "$work/lm/calib" "${args[@]}" -o "$work/out_$dev.onnx" --report "$work/report_$dev.json"
done
if [[ "${ORT_RTN:-0}" == 1 ]]; then
  printf '[w]\nqscheme = "per-group-symmetric"\nbits = 4\ngroup_size = 128\nquantizer = "rtn"\n[calibration]\ncount = 8\n[export]\nweight_format = "matmul_nbits"\n' > "$work/rtn.toml"
  /usr/bin/time -f "%e %M" -o "$work/time_rtn" "$bin" -q quantize "$work/lm/model.onnx" -c "$work/rtn.toml" \
    --calib "$work/lm/calib" --device cuda -o "$work/rtn_sparsebit.onnx"
  /usr/bin/time -f "%e %M" -o "$work/time_ort_rtn" "$python" - "$work" <<'PY'
import sys
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
w = sys.argv[1]
q = MatMulNBitsQuantizer(f"{w}/lm/model.onnx", block_size=128, is_symmetric=True)
q.process()
q.model.save_model_to_file(f"{w}/rtn_ort.onnx", use_external_data_format=True)
PY
  for t in rtn ort_rtn; do read -r s kb < "$work/time_$t"; echo "round to nearest into MatMulNBits, $t: $s s, peak host $((kb / 1024)) MiB"; done
fi
"$python" - "$work" "$devices" <<'PY'
import json, sys
w = sys.argv[1]
devices = sys.argv[2].split()
info = json.load(open(f"{w}/lm/info.json"))
rec = {d: {r["node"]: r for r in json.load(open(f"{w}/report_{d}.json"))["calibration"]["reconstructions"]} for d in devices}
first = rec[devices[0]]
print(f"model: {info['parameters']} parameters (d {info['d_model']}, {info['layers']} layers, ff {info['ff']}, "
      f"{info.get('arch', 'gpt')}), {len(first)} layers solved")
for other in devices[1:]:
    worst = max(abs(rec[devices[0]][n]["mse_learnt"] / rec[other][n]["mse_learnt"] - 1) for n in first)
    print(f"largest relative difference of a layer's GPTQ output MSE, {devices[0]} vs {other}: {worst:.2e}")
gain = sum(r["mse_learnt"] / r["mse_nearest"] for r in first.values()) / len(first)
print(f"mean output MSE after / before GPTQ: {gain:.3f}")
print("| device | whole run s | calibration s | peak host MiB (of the launching process) |")
print("|---|---:|---:|---:|")
for d in devices:
    s, kb = open(f"{w}/time_{d}").read().split()
    cal = json.load(open(f"{w}/report_{d}.json"))["calibration"]["seconds"]
    print(f"| {d} | {float(s):.1f} | {cal:.1f} | {int(kb) / 1024:.0f} |")
PY
