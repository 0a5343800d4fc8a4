#!/usr/bin/env bash
# One QAT step on a GPU against PyTorch's own QAT on the same card, in one run (docs/GPU.md,
# "QAT step"): torchvision resnet18 and resnet50 (random weights), batch 64, 1,024 random
# samples per epoch, distillation (MSE) from the float model with its forward in every step,
# Adam. Ours: `sparsebit qat` W8A8 (per-channel weights, straight-through), the second of two
# epochs, with TF32 off and on ([qat] tf32) and with the teacher's outputs cached
# ([qat] cache_teacher); then a profiled run (SPARSEBIT_QAT_PROFILE=1: the phases of a step and
# the ATen operators it dispatches). PyTorch: prepare_qat_fx with the default fbgemm QAT qconfig
# (8-bit fake quantization, per-channel weights), the same batches, TF32 off and on. Prints ms
# per step and the ratio ours / PyTorch's.
# Needs a CUDA build (scripts/device-build.sh) and Python with torch, torchvision and numpy.
#   bench/gpu_qat_step.sh SPARSEBIT_BINARY [WORK_DIR [MODELS]]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
models="${3:-resnet18 resnet50}"
python="${PYTHON:-python3}"
mkdir -p "$work/data"
for m in $models; do
  [[ -f "$work/zoo/$m/model.onnx" ]] || "$python" "$root/tests/models/make_models.py" "$work/zoo" "$m" >/dev/null 2>&1
done
"$python" - "$work/data" <<'PY'
import os, sys, numpy as np
rng = np.random.default_rng(0)
for i in range(16):  # 1,024 samples in batches of 64
    path = f"{sys.argv[1]}/batch{i:02d}.npy"
    if not os.path.exists(path):
        np.save(path, rng.standard_normal((64, 3, 224, 224), dtype=np.float32))
PY
cat >"$work/qat.toml" <<'EOF'
backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
[calibration]
batch_size = 64
count = 128
[qat]
epochs = 2
batch_size = 64
count = 1024
lr = 1e-5
EOF
printf '%s\n' 'tf32 = true' >"$work/tf32.extra"
printf '%s\n' 'cache_teacher = true' >"$work/cache.extra"
for variant in fp32 tf32 cache tf32_cache; do
  cp "$work/qat.toml" "$work/$variant.toml"
  [[ $variant == *tf32* ]] && cat "$work/tf32.extra" >>"$work/$variant.toml"
  [[ $variant == *cache* ]] && cat "$work/cache.extra" >>"$work/$variant.toml"
done
for m in $models; do
  for variant in fp32 tf32 cache tf32_cache; do
    "$bin" -q qat "$work/zoo/$m/model.onnx" -c "$work/$variant.toml" --calib "$work/data" --train "$work/data" \
      --device cuda --restart -o "$work/${m}_$variant.onnx" --report "$work/${m}_$variant.json" 2>/dev/null
  done
  SPARSEBIT_QAT_PROFILE=1 "$bin" qat "$work/zoo/$m/model.onnx" -c "$work/fp32.toml" --calib "$work/data" \
    --train "$work/data" --device cuda --restart -o "$work/${m}_profile.onnx" 2>&1 | grep "profile, epoch 2" |
    sed "s/^/$m: /" >"$work/${m}_profile.txt"
  "$python" - "$work" "$m" <<'PY'
import glob, json, sys, time
import numpy as np, torch, torchvision
from torch.ao.quantization import get_default_qat_qconfig_mapping
from torch.ao.quantization.quantize_fx import prepare_qat_fx
work, name = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
batches = [torch.from_numpy(np.load(p)).cuda() for p in sorted(glob.glob(f"{work}/data/*.npy"))]
out = {}
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    teacher = getattr(torchvision.models, name)().cuda().eval()
    student = getattr(torchvision.models, name)()
    student.load_state_dict(teacher.state_dict())
    student = prepare_qat_fx(student.train(), get_default_qat_qconfig_mapping("fbgemm"),
                             (batches[0][:1].cpu(),)).cuda()
    adam = torch.optim.Adam(student.parameters(), lr=1e-5)
    times = []
    for epoch in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x in batches:
            with torch.no_grad():
                target = teacher(x)
            loss = torch.nn.functional.mse_loss(student(x), target)
            adam.zero_grad()
            loss.backward()
            adam.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / len(batches) * 1000)
    out["tf32" if tf32 else "fp32"] = times[-1]
json.dump(out, open(f"{work}/{name}_torch.json", "w"))
PY
done
"$python" - "$work" $models <<'PY'
import json, sys
work, models = sys.argv[1], sys.argv[2:]
def ours(m, v):
    e = json.load(open(f"{work}/{m}_{v}.json"))["qat"]["epochs"][-1]
    return e["seconds"] / (e["samples"] / 64) * 1000, e["loss"]
print("| model | PyTorch FX QAT ms/step, TF32 off | ours | ours / PyTorch | PyTorch, TF32 on | ours, [qat] tf32 | ours / PyTorch "
      "| ours, cache_teacher | ours, tf32 + cache_teacher |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in models:
    t = json.load(open(f"{work}/{m}_torch.json"))
    o = {v: ours(m, v)[0] for v in ("fp32", "tf32", "cache", "tf32_cache")}
    print(f"| {m} | {t['fp32']:.1f} | {o['fp32']:.1f} | {o['fp32'] / t['fp32']:.2f} | {t['tf32']:.1f} | {o['tf32']:.1f} "
          f"| {o['tf32'] / t['tf32']:.2f} | {o['cache']:.1f} | {o['tf32_cache']:.1f} |")
for m in models:
    print(f"{m}: last-epoch loss fp32 {ours(m, 'fp32')[1]:.6g}, cache_teacher {ours(m, 'cache')[1]:.6g}, "
          f"tf32 {ours(m, 'tf32')[1]:.6g}")
    print(open(f"{work}/{m}_profile.txt").read().strip())
PY
