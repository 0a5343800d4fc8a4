#!/usr/bin/env bash
# The whole model on the GPU, float16 against 4-bit weights: a byte-level decoder of the shape
# given (make_tiny_lm.py --dynamic-length, trained STEPS steps there), its round-to-nearest W4
# g128 export into ONNX Runtime's MatMulNBits (`sparsebit quantize --device DEVICE`), then
# gpu_perplexity on each in float32 and float16: held-out perplexity, the evaluation's seconds
# over the same windows (32 at a time), and a greedy decode at batch 1 (16 prompt bytes, DECODE
# generated, every step a model run over the tokens so far: the exports have no KV cache). Prints
# a Markdown table with the ratios to the float16 model and how many decoded bytes agree with it.
#
#   bench/llm/gpu_decode.sh BUILD_DIR WORK_DIR [D,LAYERS,HEADS,FF]
#
# The default shape, 2048,16,32,8192 with ARCH=llama: 1.075 B parameters (gpu_methods.sh's).
# Environment: DEVICE (cuda), ARCH (llama or gpt), STEPS (100), DECODE (64), PYTHON (python3 with
# PyTorch). Needs a build with CUDA (scripts/device-build.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$1"
work="$2"
shape="${3:-2048,16,32,8192}"
device="${DEVICE:-cuda}"
python="${PYTHON:-python3}"
mkdir -p "$work"

if [[ ! -f "$work/lm/model.onnx" ]]; then
  "$python" "$root/bench/llm/make_tiny_lm.py" "$work/lm" --steps "${STEPS:-100}" --shape "$shape" \
    --arch "${ARCH:-llama}" --device "$device" --dynamic-length > "$work/make.log"
fi
if [[ ! -f "$work/w4.onnx" ]]; then
  printf '[w]\nqscheme = "per-group-symmetric"\nbits = 4\ngroup_size = 128\nquantizer = "rtn"\n[export]\nweight_format = "matmul_nbits"\n' \
    > "$work/w4.toml"
  "$build/bin/sparsebit" -q quantize "$work/lm/model.onnx" -c "$work/w4.toml" --calib "$work/lm/calib" \
    --device "$device" -o "$work/w4.onnx"
fi
for dtype in float16 float32; do
  for model in lm/model w4; do
    "$build/bin/gpu_perplexity" "$work/$model.onnx" "$work/lm/eval" --device "$device" --dtype "$dtype" \
      --decode "${DECODE:-64}" | tail -n 1 > "$work/run_${model//\//_}_$dtype.json"
  done
done

"$python" - "$work" "$device" <<'PY'
import json, sys
w, device = sys.argv[1], sys.argv[2]
info = json.load(open(f"{w}/lm/info.json"))
runs = {(m, d): json.load(open(f"{w}/run_{m}_{d}.json")) for m in ("lm_model", "w4") for d in ("float16", "float32")}
ref = runs[("lm_model", "float16")]
n = info["parameters"]
print(f"model: {n / 1e9:.2f} B" if n >= 1e8 else f"model: {n / 1e6:.2f} M", end="")
print(f" parameters ({info.get('arch', 'gpt')}, d {info['d_model']}, {info['layers']} layers, "
      f"ff {info['ff']}), {info['steps']} training steps, {ref['windows']} held-out windows of {info['ctx']} "
      f"bytes; device {device}; decode: {ref['decode']['tokens']} bytes after a 16-byte prompt, rows = {ref['decode']['rows']}")
print("| model | activations | perplexity | evaluation s | vs float16 | decode tokens/s | vs float16 | decoded bytes as float16's |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for (m, d), r in sorted(runs.items(), key=lambda kv: (kv[0][1] != "float16", kv[0][0] != "lm_model")):
    ids, ref_ids = r["decode"]["ids"], ref["decode"]["ids"]
    same = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), len(ids))
    print(f"| {'float' if m == 'lm_model' else 'W4 g128 RTN (MatMulNBits)'} | {d} | {r['perplexity']:.4f} | "
          f"{r['seconds']:.2f} | {ref['seconds'] / r['seconds']:.2f}x | {r['decode']['tokens_per_s']:.1f} | "
          f"{r['decode']['tokens_per_s'] / ref['decode']['tokens_per_s']:.2f}x | first {same} of {len(ids)} |")
PY
