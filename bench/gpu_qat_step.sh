#!/usr/bin/env bash
# One QAT step on a GPU against PyTorch's own QAT on the same card, in one run (docs/GPU.md,
# "QAT step"): torchvision resnet18 and resnet50 (random weights), batch 64, 1,024 random
# samples per epoch, distillation (MSE) from the float model with its forward in every step,
# Adam. Ours: `sparsebit qat` W8A8 (per-channel weights, straight-through), the second of two
# epochs, with TF32 off and on ([qat] tf32), the teacher's outputs cached ([qat] cache_teacher),
# steps replayed from CUDA graphs ([qat] cuda_graph), W4A4 LSQ, and deterministic algorithms with
# and without graphs (their losses compared); then a profiled run (SPARSEBIT_QAT_PROFILE=1: the
# phases of a step and the ATen operators it dispatches). PyTorch: prepare_qat_fx with the default fbgemm QAT qconfig
# (8-bit fake quantization, per-channel weights), the same batches, TF32 off and on; and, where
# the variants include lsq, W4A4 with PyTorch's learnable fake quantization (_LearnableFakeQuantize
# with LSQ's gradient scaling, per-channel weights) against ours W4A4 LSQ. Prints ms per step and
# the ratio ours / PyTorch's.
# Needs a CUDA build (scripts/device-build.sh) and Python with torch, torchvision and numpy.
#   bench/gpu_qat_step.sh SPARSEBIT_BINARY [WORK_DIR [MODELS]]
# QAT_STEP_REDUCED=1 is the setting CI runs on the CPU (ctest bench.qat_step_reduced): resnet18,
# 3 batches of 4, no TF32 or profile; it checks that the variants that must not change the
# arithmetic there (cache_teacher, cuda_graph, which applies to GPUs only, deterministic) give
# the plain run's losses to the last bit, and prints ours against PyTorch's FX QAT on the CPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
python="${PYTHON:-python3}"
if [[ ${QAT_STEP_REDUCED:-0} == 1 ]]; then
  device=cpu batch=4 batches=3 models="${3:-resnet18}" variants="fp32 cache graph det"
else
  device=cuda batch=64 batches=16 models="${3:-resnet18 resnet50}"
  variants="fp32 tf32 cache tf32_cache graph tf32_graph tf32_cache_graph lsq lsq_graph lsq_tf32 det det_graph"
fi
variants="${QAT_STEP_VARIANTS:-$variants}"  # a subset, e.g. "fp32 tf32
mkdir -p "$work/data"
for m in $models; do
  [[ -f "$work/zoo/$m/model.onnx" ]] || "$python" "$root/tests/models/make_models.py" "$work/zoo" "$m" >/dev/null 2>&1
done
"$python" - "$work/data" "$batch" "$batches" <<'PY'
import os, sys, numpy as np
rng = np.random.default_rng(0)
batch, batches = int(sys.argv[2]), int(sys.argv[3])
for i in range(batches):  # 1,024 samples in batches of 64 (12 in batches of 4 reduced)
    path = f"{sys.argv[1]}/batch{i:02d}.npy"
    if not os.path.exists(path):
        np.save(path, rng.standard_normal((batch, 3, 224, 224), dtype=np.float32))
PY
# Our variants: the base W8A8 config plus [qat] keys; "lsq" is W4A4 with LSQ for weights and
# activations (configs/w4a4_lsq.toml's scheme, every layer at 4 bits).
config() {  # NAME BITS QUANTIZER QAT_KEYS...
  local name=$1 bits=$2 quantizer=$3
  shift 3
  {
    printf 'backend = "virtual"\n[w]\nqscheme = "per-channel-symmetric"\nbits = %s\nquantizer = "%s"\n' "$bits" "$quantizer"
    printf '[a]\nqscheme = "per-tensor-affine"\nbits = %s\nquantizer = "%s"\n' "$bits" "$quantizer"
    printf '[calibration]\nbatch_size = %s\ncount = %s\n' "$batch" $((2 * batch))
    printf '[qat]\nepochs = 2\nbatch_size = %s\ncount = %s\nlr = 1e-5\n' "$batch" $((batch * batches))
    for key in "$@"; do printf '%s = true\n' "$key"; done
  } >"$work/$name.toml"
}
config fp32 8 uniform
config tf32 8 uniform tf32
config cache 8 uniform cache_teacher
config tf32_cache 8 uniform tf32 cache_teacher
config graph 8 uniform cuda_graph
config tf32_graph 8 uniform tf32 cuda_graph
config tf32_cache_graph 8 uniform tf32 cache_teacher cuda_graph
config lsq 4 lsq
config lsq_graph 4 lsq cuda_graph
config lsq_tf32 4 lsq tf32
config det 8 uniform deterministic
config det_graph 8 uniform deterministic cuda_graph
for m in $models; do
  for variant in $variants; do
    "$bin" -q qat "$work/zoo/$m/model.onnx" -c "$work/$variant.toml" --calib "$work/data" --train "$work/data" \
      --device $device --restart -o "$work/${m}_$variant.onnx" --report "$work/${m}_$variant.json" 2>"$work/${m}_$variant.log"
  done
  if [[ $device == cuda && ${QAT_STEP_PROFILE:-1} == 1 ]]; then  # QAT_STEP_PROFILE=0 skips it
    SPARSEBIT_QAT_PROFILE=1 "$bin" qat "$work/zoo/$m/model.onnx" -c "$work/fp32.toml" --calib "$work/data" \
      --train "$work/data" --device cuda --restart -o "$work/${m}_profile.onnx" 2>&1 | grep "profile, epoch 2" |
      sed "s/^/$m: /" >"$work/${m}_profile.txt"
  fi
  torch_lsq=0
  [[ " $variants " == *" lsq "* ]] && torch_lsq=1
  "$python" - "$work" "$m" "$device" "$torch_lsq" <<'PY'
import glob, json, sys, time
import numpy as np, torch, torchvision
from torch.ao.quantization import (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver, QConfig,
                                   QConfigMapping, get_default_qat_qconfig_mapping)
from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize
from torch.ao.quantization.quantize_fx import prepare_qat_fx
work, name, device, lsq = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
torch.manual_seed(0)
batches = [torch.from_numpy(np.load(p)).to(device) for p in sorted(glob.glob(f"{work}/data/*.npy"))]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

def lsq_mapping(model):
    # W4A4 with PyTorch's learnable fake quantization (scale and zero point learnt, LSQ's gradient
    # scaling): activations per tensor 0..15, weights per output channel -8..7. A per-channel
    # learnable quantizer needs its channel count when it is made, so each conv / linear gets its own.
    act = _LearnableFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=15,
                                           dtype=torch.quint8, qscheme=torch.per_tensor_affine, use_grad_scaling=True)
    def weight(channels):
        return _LearnableFakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, quant_min=-8,
                                                quant_max=7, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                                ch_axis=0, channel_len=channels, use_grad_scaling=True)
    mapping = QConfigMapping().set_global(QConfig(activation=act, weight=weight(-1)))
    for n, m in model.named_modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            mapping.set_module_name(n, QConfig(activation=act, weight=weight(m.weight.shape[0])))
    return mapping

def step_ms(tf32, kind):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    teacher = getattr(torchvision.models, name)().to(device).eval()
    student = getattr(torchvision.models, name)()
    student.load_state_dict(teacher.state_dict())
    mapping = lsq_mapping(student) if kind == "lsq" else get_default_qat_qconfig_mapping("fbgemm")
    student = prepare_qat_fx(student.train(), mapping, (batches[0][:1].cpu(),)).to(device)
    if kind == "lsq":  # calibrate the scales on the first batches, as ours does, then learn them
        with torch.no_grad():
            for x in batches[:2]:
                student(x)
        for m in student.modules():
            if isinstance(m, _LearnableFakeQuantize):
                m.enable_param_learning()
    adam = torch.optim.Adam(student.parameters(), lr=1e-5)
    times = []
    for epoch in range(2):
        sync()
        t0 = time.perf_counter()
        for x in batches:
            with torch.no_grad():
                target = teacher(x)
            loss = torch.nn.functional.mse_loss(student(x), target)
            adam.zero_grad()
            loss.backward()
            adam.step()
        sync()
        times.append((time.perf_counter() - t0) / len(batches) * 1000)
    return times[-1]

out = {}
for tf32 in ((False, True) if device == "cuda" else (False,)):
    for kind in ("w8a8", "lsq") if lsq else ("w8a8",):
        out[("tf32" if tf32 else "fp32") + ("_lsq" if kind == "lsq" else "")] = step_ms(tf32, kind)
json.dump(out, open(f"{work}/{name}_torch.json", "w"))
PY
done
"$python" - "$work" "$batch" "$device" $models <<'PY'
import json, sys
work, batch, device, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def ours(m, v):
    e = json.load(open(f"{work}/{m}_{v}.json"))["qat"]["epochs"][-1]
    return e["seconds"] / (e["samples"] / batch) * 1000, e["loss"]
if device == "cpu":  # the reduced setting: exactness checks, then the times
    failed = False
    for m in models:
        t = json.load(open(f"{work}/{m}_torch.json"))
        plain = ours(m, "fp32")
        print(f"{m} on the CPU, batch {batch}: ours {plain[0]:.1f} ms/step, PyTorch FX QAT {t['fp32']:.1f} ms/step, "
              f"ratio {plain[0] / t['fp32']:.2f}; last-epoch loss {plain[1]:.9g}")
        for v in ("cache", "graph", "det"):
            loss = ours(m, v)[1]
            graphed = [e.get("graphed_steps") for e in json.load(open(f"{work}/{m}_{v}.json"))["qat"]["epochs"]]
            same = loss == plain[1] and graphed == [0, 0]
            failed |= not same
            print(f"  {v}: loss {loss:.9g} ({'the same' if same else 'DIFFERENT'}), graphed steps {graphed}")
    sys.exit(1 if failed else 0)
# The GPU tables; a variant that was not run (QAT_STEP_VARIANTS) leaves its cell empty.
import os
def ms(m, v):
    return ours(m, v)[0] if os.path.exists(f"{work}/{m}_{v}.json") else None
def cell(x):
    return "" if x is None else f"{x:.1f}"
def ratio(best, theirs):
    best = [x for x in best if x is not None]
    return f"{min(best) / theirs:.2f}" if best and theirs else ""
print("| model | PyTorch FX QAT ms/step, TF32 off | ours | ours, cuda_graph | best ours / PyTorch "
      "| PyTorch, TF32 on | ours, [qat] tf32 | tf32 + cuda_graph | best ours / PyTorch | tf32 + cache_teacher + cuda_graph |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in models:
    t = json.load(open(f"{work}/{m}_torch.json"))
    o = {v: ms(m, v) for v in ("fp32", "graph", "tf32", "tf32_graph", "tf32_cache_graph")}
    print(f"| {m} | {t['fp32']:.1f} | {cell(o['fp32'])} | {cell(o['graph'])} | {ratio([o['fp32'], o['graph']], t['fp32'])} "
          f"| {t['tf32']:.1f} | {cell(o['tf32'])} | {cell(o['tf32_graph'])} | {ratio([o['tf32'], o['tf32_graph']], t['tf32'])} "
          f"| {cell(o['tf32_cache_graph'])} |")
print()
print("| model | PyTorch W4A4 learnable fake quant, TF32 off | ours, W4A4 LSQ | LSQ + cuda_graph | best ours / PyTorch "
      "| PyTorch, TF32 on | ours, LSQ + tf32 | ours / PyTorch | cache_teacher | tf32 + cache_teacher |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in models:
    t = json.load(open(f"{work}/{m}_torch.json"))
    o = {v: ms(m, v) for v in ("lsq", "lsq_graph", "lsq_tf32", "cache", "tf32_cache")}
    print(f"| {m} | {cell(t.get('fp32_lsq'))} | {cell(o['lsq'])} | {cell(o['lsq_graph'])} "
          f"| {ratio([o['lsq'], o['lsq_graph']], t.get('fp32_lsq'))} | {cell(t.get('tf32_lsq'))} | {cell(o['lsq_tf32'])} "
          f"| {ratio([o['lsq_tf32']], t.get('tf32_lsq'))} | {cell(o['cache'])} | {cell(o['tf32_cache'])} |")
print()
for m in models:
    if all(ms(m, v) is not None for v in ("fp32", "graph", "det", "det_graph", "tf32", "tf32_graph")):
        det, det_graph = ours(m, "det")[1], ours(m, "det_graph")[1]
        print(f"{m}: last-epoch loss fp32 {ours(m, 'fp32')[1]:.7g}, cuda_graph {ours(m, 'graph')[1]:.7g}; deterministic "
              f"{det:.7g}, deterministic + cuda_graph {det_graph:.7g} (relative difference {abs(det - det_graph) / det:.2e}); "
              f"tf32 {ours(m, 'tf32')[1]:.7g}, tf32 + cuda_graph {ours(m, 'tf32_graph')[1]:.7g}")
    for v in ("graph", "tf32_graph", "lsq_graph", "det_graph"):
        if ms(m, v) is not None:
            e = json.load(open(f"{work}/{m}_{v}.json"))["qat"]["epochs"]
            print(f"  {v}: steps replayed from graphs per epoch {[x.get('graphed_steps') for x in e]}")
    if os.path.exists(f"{work}/{m}_profile.txt"):
        print(open(f"{work}/{m}_profile.txt").read().strip())
PY
