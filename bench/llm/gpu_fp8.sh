#!/usr/bin/env bash
# FP8 exports evaluated on the GPU against the CPU: a byte-level decoder (make_tiny_lm.py, shape
# and steps as given) quantized by `sparsebit quantize` with configs/fp8_tensorrt.toml (E4M3) and
# its E5M2 variant, and the held-out perplexity of the float model and of each export computed by
# Sparsebit's executor (gpu_perplexity) on CUDA and on the CPU, on the same windows. The float
# arithmetic of the two devices differs (summation order, TF32 is off), so the figures agree to a
# relative tolerance, not bit for bit: --check fails a run whose perplexities differ by more than
# 1e-4 relative between the devices, for the float model or any export.
#
#   bench/llm/gpu_fp8.sh BUILD_DIR WORK_DIR [D,LAYERS,HEADS,FF] [--check]
#
# Environment: ARCH (llama or gpt, default llama), STEPS (100), PYTHON (python3: PyTorch for
# make_tiny_lm.py). Needs a build with CUDA (scripts/device-build.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$1"
work="$2"
shift 2
shape="512,4,8,2048"
check=0
for a in "$@"; do
  if [[ "$a" == --check ]]; then check=1; else shape="$a"; fi
done
python="${PYTHON:-python3}"
mkdir -p "$work"

if [[ ! -f "$work/lm/model.onnx" ]]; then
  "$python" "$root/bench/llm/make_tiny_lm.py" "$work/lm" --steps "${STEPS:-100}" --shape "$shape" \
    --arch "${ARCH:-llama}" --device cuda > "$work/make.log"
fi
cp "$root/configs/fp8_tensorrt.toml" "$work/e4m3.toml"
sed 's/fp8_e4m3/fp8_e5m2/' "$root/configs/fp8_tensorrt.toml" > "$work/e5m2.toml"
for scheme in e4m3 e5m2; do
  /usr/bin/time -f "%e" -o "$work/time_$scheme" "$build/bin/sparsebit" -q quantize "$work/lm/model.onnx" \
    -c "$work/$scheme.toml" --calib "$work/lm/calib" --device cuda -o "$work/$scheme.onnx"
done
for model in lm/model e4m3 e5m2; do
  for device in cuda cpu; do
    "$build/bin/gpu_perplexity" "$work/$model.onnx" "$work/lm/eval" --device "$device" \
      | tail -n 1 > "$work/ppl_${model//\//_}_$device.json"
  done
done

"$python" - "$work" "$check" <<'PY'
import json, sys
w, check = sys.argv[1], sys.argv[2] == "1"
info = json.load(open(f"{w}/lm/info.json"))
print(f"model: {info['parameters'] / 1e6:.1f} M parameters ({info.get('arch', 'gpt')}, d {info['d_model']}, "
      f"{info['layers']} layers, ff {info['ff']}), {info['steps']} training steps")
print("| model | perplexity, CUDA | perplexity, CPU | relative difference | seconds CUDA / CPU |")
print("|---|---:|---:|---:|---:|")
worst = 0.0
for m, label in (("lm_model", "float"), ("e4m3", "FP8 E4M3 (configs/fp8_tensorrt.toml)"), ("e5m2", "FP8 E5M2")):
    g, c = (json.load(open(f"{w}/ppl_{m}_{d}.json")) for d in ("cuda", "cpu"))
    rel = abs(g["perplexity"] - c["perplexity"]) / c["perplexity"]
    worst = max(worst, rel)
    print(f"| {label} | {g['perplexity']:.6f} | {c['perplexity']:.6f} | {rel:.2e} | "
          f"{g['seconds']:.2f} / {c['seconds']:.2f} |")
if check and worst > 1e-4:
    sys.exit(f"CUDA and CPU perplexities differ by {worst:.2e} relative (tolerance 1e-4)")
PY
