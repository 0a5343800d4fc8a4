#!/usr/bin/env bash
# AdaRound's layer reconstruction on a GPU against the CPUs of the same machine, in one run
# (docs/GPU.md, "AdaRound on the GPU"): configs/w4a8_adaround.toml (asym calibration, 2,000
# steps of 32 samples per layer) on the Fashion-MNIST CNN (512 random images) and on torchvision
# resnet18 (random weights, 256 random images at batch 64, 500 steps per layer). Rows: the CPUs,
# the GPU with eager steps, the GPU with steps replayed from CUDA graphs ([calibration]
# cuda_graph). Prints the seconds spent reconstructing (sum over layers), the whole run, ms per
# step, and the mean ratio of each layer's learnt output error to round-to-nearest's (equal
# quality is the point: the graphs replay the eager arithmetic).
# Needs a CUDA build (scripts/device-build.sh) and Python with torch, torchvision and numpy.
#   bench/gpu_adaround.sh SPARSEBIT_BINARY [WORK_DIR]
# ADAROUND_MODELS="cnn resnet18" and ADAROUND_DEVICES="cpu cuda cuda_graph" choose the rows.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
python="${PYTHON:-python3}"
models="${ADAROUND_MODELS:-cnn resnet18}"
devices="${ADAROUND_DEVICES:-cpu cuda cuda_graph}"
mkdir -p "$work"
"$python" - "$work" <<'PY'
import os, sys, numpy as np
rng = np.random.default_rng(0)
for name, shape, batches in (("cnn", (64, 1, 28, 28), 8), ("resnet18", (64, 3, 224, 224), 4)):
    os.makedirs(f"{sys.argv[1]}/data_{name}", exist_ok=True)
    for i in range(batches):
        np.save(f"{sys.argv[1]}/data_{name}/batch{i:02d}.npy", rng.standard_normal(shape, dtype=np.float32))
PY
for m in $models; do
  if [[ $m == resnet18 && ! -f "$work/zoo/resnet18/model.onnx" ]]; then
    "$python" "$root/tests/models/make_models.py" "$work/zoo" resnet18 >/dev/null 2>&1
  fi
done
model_of() { [[ $1 == cnn ]] && echo "$root/examples/fashion_mnist/fashion_mnist_cnn.onnx" || echo "$work/zoo/$1/model.onnx"; }
config_of() {  # MODEL DEVICE_ROW
  local out="$work/$1_$2.toml"
  sed -e '/^\[calibration\]/,$d' "$root/configs/w4a8_adaround.toml" >"$out"
  [[ $1 == resnet18 ]] && sed -i 's/^iterations = 2000/iterations = 500/' "$out"
  printf '[calibration]\nbatch_size = 64\ncount = %s\nmode = "asym"\ncuda_graph = %s\n' \
    "$([[ $1 == cnn ]] && echo 512 || echo 256)" "$([[ $2 == cuda_graph ]] && echo true || echo false)" >>"$out"
  echo "$out"
}
for m in $models; do
  for d in $devices; do
    [[ $m == resnet18 && $d == cpu ]] && continue  # hours on a few cores; the CNN shows the CPU
    t0=$(date +%s.%N)
    "$bin" -q quantize "$(model_of "$m")" -c "$(config_of "$m" "$d")" --calib "$work/data_$m" \
      --device "${d%_graph}" -o "$work/${m}_$d.onnx" --report "$work/${m}_$d.json"
    t1=$(date +%s.%N)
    echo "$t0 $t1" >"$work/${m}_$d.time"
  done
done
"$python" - "$work" "$models" "$devices" <<'PY'
import json, os, sys
work, models, devices = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print("| model | run | layers | reconstruction s | ms per step | replayed steps | whole run s | learnt / nearest output MSE (mean over layers) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for m in models:
    for d in devices:
        path = f"{work}/{m}_{d}.json"
        if not os.path.exists(path):
            continue
        rec = json.load(open(path))["calibration"]["reconstructions"]
        t0, t1 = map(float, open(f"{work}/{m}_{d}.time").read().split())
        seconds = sum(r["seconds"] for r in rec)
        steps = sum(r["iterations"] for r in rec)
        replayed = sum(r.get("recorded_steps", 0) for r in rec)
        ratio = sum(r["mse_learnt"] / max(r["mse_nearest"], 1e-30) for r in rec) / max(len(rec), 1)
        print(f"| {m} | {d} | {len(rec)} | {seconds:.2f} | {1000 * seconds / max(steps, 1):.3f} | {replayed} | {t1 - t0:.2f} | {ratio:.4f} |")
PY
