#!/usr/bin/env bash
# GPTQ on the GPU against the same run on the CPUs, one machine: a decoder of the shape given
# (make_tiny_lm.py --shape, a few training steps: the timing does not depend on the weights'
# values), quantized with configs/w4_gptq.toml by `sparsebit quantize --device cuda` and
# `--device cpu`; prints wall times, peak host memory and the largest per-layer difference of the
# output MSEs the two reports give. Needs a CUDA build (scripts/device-build.sh).
#   bench/llm/gpu_gptq.sh SPARSEBIT_BINARY WORK_DIR [D,LAYERS,HEADS,FF]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$1"
work="$2"
shape="${3:-1024,8,16,4096}"
python="${PYTHON:-python3}"
mkdir -p "$work"
[[ -f "$work/lm/model.onnx" ]] || "$python" "$root/bench/llm/make_tiny_lm.py" "$work/lm" --steps 2 --shape "$shape" > "$work/make.log"
for dev in cuda cpu; do
  /usr/bin/time -f "%e %M" -o "$work/time_$dev" "$bin" -q quantize "$work/lm/model.onnx" -c "$root/configs/w4_gptq.toml" \
    --calib "$work/lm/calib" --device "$dev" -o "$work/out_$dev.onnx" --report "$work/report_$dev.json"
done
"$python" - "$work" <<'PY'
import json, sys
w = sys.argv[1]
info = json.load(open(f"{w}/lm/info.json"))
rec = {d: {r["node"]: r for r in json.load(open(f"{w}/report_{d}.json"))["calibration"]["reconstructions"]} for d in ("cuda", "cpu")}
worst = max(abs(rec["cuda"][n]["mse_learnt"] / rec["cpu"][n]["mse_learnt"] - 1) for n in rec["cpu"])
gain = sum(r["mse_learnt"] / r["mse_nearest"] for r in rec["cpu"].values()) / len(rec["cpu"])
print(f"model: {info['parameters']} parameters (d {info['d_model']}, {info['layers']} layers, ff {info['ff']}), "
      f"{len(rec['cpu'])} layers solved")
print("| device | whole run s | calibration s | peak host MiB |")
print("|---|---:|---:|---:|")
for d in ("cuda", "cpu"):
    s, kb = open(f"{w}/time_{d}").read().split()
    cal = json.load(open(f"{w}/report_{d}.json"))["calibration"]["seconds"]
    print(f"| {d} | {float(s):.1f} | {cal:.1f} | {int(kb) / 1024:.0f} |")
print(f"largest relative difference of a layer's GPTQ output MSE, GPU vs CPU: {worst:.2e}; "
      f"mean MSE after / before GPTQ: {gain:.3f}")
PY
