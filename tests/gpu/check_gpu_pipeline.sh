#!/usr/bin/env bash
# The whole pipeline on a GPU against the CPU: quantizes each model with the same config and
# random calibration data (npy) on the CPU, on CUDA with the kernels plugin, and on CUDA with the
# kernels switched off (SPARSEBIT_KERNELS=0, ATen on the GPU); compares the exported scales and
# zero points (compare_reports.py). Needs a CUDA build (scripts/device-build.sh).
#   tests/gpu/check_gpu_pipeline.sh SPARSEBIT_BINARY CONFIG WORK_DIR MODEL[:C,H,W]...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$1" config="$2" work="$3"
shift 3
python="${PYTHON:-python3}"
mkdir -p "$work"
for spec in "$@"; do
  model="${spec%%:*}" shape="${spec#*:}"
  [[ "$spec" == *:* ]] || shape="3,224,224"
  name="$(basename "$model" .onnx)"
  data="$work/$name-data"
  mkdir -p "$data"
  "$python" - "$data" "$shape" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
shape = tuple(int(v) for v in sys.argv[2].split(","))
for i in range(4):
    np.save(f"{sys.argv[1]}/batch{i}.npy", rng.standard_normal((32,) + shape, dtype=np.float32))
PY
  for run in cpu cuda cuda-aten; do
    device="${run%-aten}"
    kernels=1
    [[ "$run" == cuda-aten ]] && kernels=0
    SPARSEBIT_KERNELS=$kernels "$bin" -q quantize "$model" -c "$config" --calib "$data" --batch-size 32 \
      --device "$device" -o "$work/$name-$run.onnx" --report "$work/$name-$run.json"
  done
  echo "== $name: cuda kernels vs cpu"
  "$python" "$here/compare_reports.py" "$work/$name-cpu.json" "$work/$name-cuda.json" 1e-5
  echo "== $name: cuda kernels vs cuda ATen"
  "$python" "$here/compare_reports.py" "$work/$name-cuda-aten.json" "$work/$name-cuda.json" 1e-5
done
