#!/usr/bin/env bash
# Round to nearest, GPTQ and AWQ compared on one decoder, everything on one device: a byte-level
# decoder of the shape given (make_tiny_lm.py --shape --arch, trained STEPS steps there), each
# method's 4-bit export (groups of 128, ONNX Runtime's MatMulNBits) made by `sparsebit quantize
# --device DEVICE`, and held-out perplexity of the float model and of each export computed by
# Sparsebit's executor (gpu_perplexity: on CUDA through the 4-bit kernels). Prints a Markdown
# table with the wall time and peak host memory (the whole process) of every quantize, so the
# comparison's cost on a model of that size shows.
#
#   bench/llm/gpu_methods.sh BUILD_DIR WORK_DIR [D,LAYERS,HEADS,FF]
#
# The default shape, 2048,16,32,8192 with ARCH=llama: 1.075 B parameters (the decoder of
# bench/RESULTS.md's GPTQ timing, there with random weights).
# Environment: DEVICE (cuda; cpu runs the same steps), ARCH (llama or gpt), STEPS (300),
# PYTHON (python3: PyTorch for make_tiny_lm.py). Needs a build with CUDA for DEVICE=cuda
# (scripts/device-build.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$1"
work="$2"
shape="${3:-2048,16,32,8192}"
device="${DEVICE:-cuda}"
python="${PYTHON:-python3}"
mkdir -p "$work"

if [[ ! -f "$work/lm/model.onnx" ]]; then
  /usr/bin/time -f "%e" -o "$work/time_make" "$python" "$root/bench/llm/make_tiny_lm.py" "$work/lm" \
    --steps "${STEPS:-300}" --shape "$shape" --arch "${ARCH:-llama}" --device "$device" > "$work/make.log"
fi

# Each method's config: the shipped one, exporting MatMulNBits.
to_nbits() { sed 's/^weight_format = .*/weight_format = "matmul_nbits"/' "$1"; }
to_nbits "$root/configs/w4_gptq.toml" > "$work/gptq.toml"
to_nbits "$root/configs/w4_awq.toml" > "$work/awq.toml"
printf '[w]\nqscheme = "per-group-symmetric"\nbits = 4\ngroup_size = 128\nquantizer = "rtn"\n[export]\nweight_format = "matmul_nbits"\n' \
  > "$work/rtn.toml"

for method in rtn gptq awq; do
  if [[ ! -f "$work/$method.onnx" ]]; then
    /usr/bin/time -f "%e %M" -o "$work/time_$method" "$build/bin/sparsebit" -q quantize "$work/lm/model.onnx" \
      -c "$work/$method.toml" --calib "$work/lm/calib" --device "$device" -o "$work/$method.onnx"
  fi
done
for model in lm/model rtn gptq awq; do
  "$build/bin/gpu_perplexity" "$work/$model.onnx" "$work/lm/eval" --device "$device" \
    | tail -n 1 > "$work/ppl_${model//\//_}.json"
done

"$python" - "$work" "$device" <<'PY'
import json, sys
w, device = sys.argv[1], sys.argv[2]
info = json.load(open(f"{w}/lm/info.json"))
ppl = {m: json.load(open(f"{w}/ppl_{m}.json")) for m in ("lm_model", "rtn", "gptq", "awq")}
def wall(name):
    try:
        return float(open(f"{w}/time_{name}").read().split()[0])
    except FileNotFoundError:
        return float("nan")
def peak_gib(name):
    try:
        return float(open(f"{w}/time_{name}").read().split()[1]) / 2**20
    except (FileNotFoundError, IndexError):
        return float("nan")
import glob, os
weights_gib = sum(os.path.getsize(f) for f in glob.glob(f"{w}/lm/model.onnx*")) / 2**30
n = info["parameters"]
print(f"model: {n / 1e9:.2f} B" if n >= 1e8 else f"model: {n / 1e6:.2f} M", end="")
print(f" parameters ({info.get('arch', 'gpt')}, d {info['d_model']}, "
      f"{info['layers']} layers, ff {info['ff']}), {info['steps']} training steps in {wall('make'):.0f} s "
      f"(with the export), {ppl['lm_model']['windows']} held-out windows; device {device}")
base = ppl["lm_model"]["perplexity"]
print(f"float model files: {weights_gib:.2f} GiB")
print("| model | quantize s | peak host GiB (x the model files) | perplexity | increase | perplexity s |")
print("|---|---:|---:|---:|---:|---:|")
print(f"| float | | | {base:.4f} | | {ppl['lm_model']['seconds']:.1f} |")
for m, label in (("rtn", "RTN"), ("gptq", "GPTQ"), ("awq", "AWQ")):
    p = ppl[m]["perplexity"]
    print(f"| {label} W4 g128 (MatMulNBits) | {wall(m):.0f} | {peak_gib(m):.2f} ({peak_gib(m) / weights_gib:.2f}x) "
          f"| {p:.4f} | {p - base:+.4f} | {ppl[m]['seconds']:.1f} |")
PY
