#!/usr/bin/env bash
# Several GPUs against one, on one machine in one run (docs/GPU.md, "Several GPUs"):
#   - QAT epoch time, resnet18 (torchvision, random weights) at batch 64 over 4,096 samples,
#     W8A8 straight-through and W4A4 LSQ (configs/w4a4_lsq.toml), and W8A8 at batch 256,
#     distillation from the float model; the epoch is the second of two (the first warms up);
#   - calibration time, resnet50 at batch 64 over 4,096 samples, W8A8 minmax;
# each with `--nproc 1, 2` (and 4 where the machine has 4 GPUs), as a Markdown table with the
# speed-up over one GPU; on 2 (and 4) GPUs, QAT with the gradients summed after backward
# (SPARSEBIT_GRADIENT_BUCKET_MB=0) against during it. Also checks that the calibrated models are
# byte-identical.
# Needs a CUDA build (scripts/device-build.sh) and Python with torch, torchvision and numpy.
#   bench/gpu_distributed.sh SPARSEBIT_BINARY [WORK_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
python="${PYTHON:-python3}"
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
counts="1 2"
((gpus >= 4)) && counts="1 2 4"
mkdir -p "$work/data"
for m in resnet18 resnet50; do
  [[ -f "$work/zoo/$m/model.onnx" ]] || "$python" "$root/tests/models/make_models.py" "$work/zoo" "$m" > /dev/null
done
"$python" - "$work/data" <<'PY'
import os, sys, numpy as np
rng = np.random.default_rng(0)
for i in range(64):  # 4,096 samples in batches of 64
    path = f"{sys.argv[1]}/batch{i:02d}.npy"
    if not os.path.exists(path):
        np.save(path, rng.standard_normal((64, 3, 224, 224), dtype=np.float32))
PY
cat > "$work/w8a8_qat.toml" <<'EOF'
backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
[calibration]
batch_size = 64
count = 256
[qat]
epochs = 2
batch_size = 64
count = 4096
lr = 1e-5
EOF
sed 's/^batch_size = 64$/batch_size = 256/' "$work/w8a8_qat.toml" > "$work/w8a8_qat_b256.toml"
sed 's/^epochs = 2$/epochs = 2\ncount = 4096/' "$root/configs/w4a4_lsq.toml" > "$work/w4a4_lsq.toml"
grep -q '^count = 4096' "$work/w4a4_lsq.toml" || { echo "configs/w4a4_lsq.toml has no 'epochs = 2' line" >&2; exit 1; }

for n in $counts; do
  for cfg in w8a8_qat w4a4_lsq w8a8_qat_b256; do
    "$bin" -q qat "$work/zoo/resnet18/model.onnx" -c "$work/$cfg.toml" --calib "$work/data" --train "$work/data" \
      --device cuda --nproc "$n" --restart -o "$work/qat_${cfg}_$n.onnx" --report "$work/qat_${cfg}_$n.json"
  done
  t0=$(date +%s.%N)
  "$bin" -q quantize "$work/zoo/resnet50/model.onnx" -c "$root/configs/w8a8_onnxruntime.toml" --calib "$work/data" \
    --batch-size 64 --calib-count 4096 --device cuda --nproc "$n" -o "$work/cal_$n.onnx" --report "$work/cal_$n.json"
  echo "$t0 $(date +%s.%N)" > "$work/cal_$n.time"
done
# The same QAT with the gradients summed after backward in one buffer: what the buckets summed
# during backward (Note [Gradient buckets]) gain.
for n in ${counts#1 }; do
  for cfg in w8a8_qat w8a8_qat_b256; do
    SPARSEBIT_GRADIENT_BUCKET_MB=0 "$bin" -q qat "$work/zoo/resnet18/model.onnx" -c "$work/$cfg.toml" \
      --calib "$work/data" --train "$work/data" --device cuda --nproc "$n" --restart -o "$work/qat_${cfg}_after.onnx" \
      --report "$work/qat_${cfg}_${n}_after.json"
  done
done
for n in $counts; do
  cmp -s "$work/cal_1.onnx" "$work/cal_$n.onnx" || { echo "FAIL: calibration with $n GPUs differs from one" >&2; exit 1; }
done
"$python" - "$work" $counts <<'PY'
import json, sys
w, counts = sys.argv[1], [int(c) for c in sys.argv[2:]]
def epoch(cfg, n):
    r = json.load(open(f"{w}/qat_{cfg}_{n}.json"))["qat"]["epochs"]
    return r[-1]["seconds"], r[-1]["loss"], r[-1]["samples"]
def cal(n):
    t0, t1 = map(float, open(f"{w}/cal_{n}.time").read().split())
    return json.load(open(f"{w}/cal_{n}.json"))["calibration"]["seconds"], t1 - t0
print("| GPUs | QAT W8A8 STE, batch 64: s/epoch | speed-up | QAT W4A4 LSQ, batch 64 | speed-up "
      "| QAT W8A8 STE, batch 256 | speed-up | calibration s | speed-up | whole quantize run s |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in counts:
    row = []
    for cfg in ("w8a8_qat", "w4a4_lsq", "w8a8_qat_b256"):
        t = epoch(cfg, n)[0]
        row += [f"{t:.2f}", f"{epoch(cfg, 1)[0] / t:.2f}x"]
    c = cal(n)
    print(f"| {n} | " + " | ".join(row) + f" | {c[0]:.2f} | {cal(1)[0] / c[0]:.2f}x | {c[1]:.2f} |")
for cfg in ("w8a8_qat", "w4a4_lsq", "w8a8_qat_b256"):
    print(f"{cfg}: last-epoch loss " + ", ".join(f"{n} GPU(s) {epoch(cfg, n)[1]:.6g}" for n in counts) +
          f" ({epoch(cfg, counts[0])[2]} samples per epoch)")
for n in counts[1:]:
    for cfg in ("w8a8_qat", "w8a8_qat_b256"):
        after = json.load(open(f"{w}/qat_{cfg}_{n}_after.json"))["qat"]["epochs"][-1]["seconds"]
        print(f"{cfg} on {n} GPUs: {epoch(cfg, n)[0]:.2f} s/epoch with gradient buckets summed during backward, "
              f"{after:.2f} s summed after it ({after / epoch(cfg, n)[0]:.2f}x)")
print("calibrated models byte-identical for " + ", ".join(f"{n}" for n in counts) + " GPUs")
PY
