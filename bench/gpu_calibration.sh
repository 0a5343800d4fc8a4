#!/usr/bin/env bash
# Calibration time of resnet50 (torchvision, random weights, exported by tests/models/make_models.py)
# at batch 64 over 1,024 samples: Sparsebit on the GPU, Sparsebit on the CPUs, and ONNX Runtime's
# quantize_static (MinMax, QDQ, per-channel) on the same CPUs, in one run on one machine, as a
# Markdown table with ratios to ORT. Also checks that the GPU and CPU runs export the same scales
# (tests/gpu/compare_reports.py). Needs a CUDA build (scripts/device-build.sh) and Python with
# torch, torchvision, onnxruntime and numpy.
#   bench/gpu_calibration.sh SPARSEBIT_BINARY [WORK_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
python="${PYTHON:-python3}"
mkdir -p "$work/data"
[[ -f "$work/zoo/resnet50/model.onnx" ]] || "$python" "$root/tests/models/make_models.py" "$work/zoo" resnet50 > /dev/null
input=$(cat "$work/zoo/resnet50/input_name")
"$python" - "$work/data" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
for i in range(16):  # 1,024 samples in batches of 64
    np.save(f"{sys.argv[1]}/batch{i:02d}.npy", rng.standard_normal((64, 3, 224, 224), dtype=np.float32))
PY
model="$work/zoo/resnet50/model.onnx"
run() {  # device
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" -q quantize "$model" -c "$root/configs/w8a8_onnxruntime.toml" --calib "$work/data" --batch-size 64 \
    --calib-count 1024 --device "$1" -o "$work/sb_$1.onnx" --report "$work/sb_$1.json"
  t1=$(date +%s.%N)
  echo "$t0 $t1" > "$work/sb_$1.time"
}
run cuda
run cpu
"$python" "$here/ort_quantize_static.py" "$model" "$work/data" "$work/ort.onnx" "$input" > "$work/ort.json"
"$python" "$root/tests/gpu/compare_reports.py" "$work/sb_cpu.json" "$work/sb_cuda.json" 1e-5 | tee "$work/parity.txt"
"$python" - "$work" <<'PY'
import json, sys
w = sys.argv[1]
ort = json.load(open(f"{w}/ort.json"))["seconds"]
print("| resnet50, batch 64, 1,024 samples | calibration s | whole run s | speed vs ORT (ORT s / this s) |")
print("|---|---|---|---|")
for dev in ("cuda", "cpu"):
    rep = json.load(open(f"{w}/sb_{dev}.json"))
    t0, t1 = map(float, open(f"{w}/sb_{dev}.time").read().split())
    print(f"| Sparsebit, {dev} | {rep['calibration']['seconds']:.2f} | {t1 - t0:.2f} | {ort / (t1 - t0):.2f} |")
print(f"| ONNX Runtime quantize_static (CPU) | | {ort:.2f} | 1.00 |")
PY
