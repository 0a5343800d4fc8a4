#!/usr/bin/env bash
# ONNX Runtime's integer kernels on an x86 processor without VNNI, whatever this machine has:
# QEMU's user-mode emulation of a Haswell (AVX2, no VNNI) runs Node and ONNX Runtime, whose
# kernels then add u8 x s8 products in pairs in 16 bits (Note [u8s8 saturation]).
#   - reduce-range weights (the main job's config) must match the simulation within one output
#     step, as they do with VNNI;
#   - full 8-bit weights, which the export check flags, must really differ there: this proves the
#     emulated kernels are the saturating ones, so the first result means something.
#
#   tests/ort/check_without_vnni.sh SPARSEBIT_BINARY OUTPUT_DIR [IMAGES]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$1"
out="$2"
count="${3:-2000}"
data=/usr/share/datasets/fashion-mnist
qemu="$(command -v qemu-x86_64)" || { echo "qemu-x86_64 is missing (apt-get install qemu-user)" >&2; exit 1; }
mkdir -p "$out"
for cfg in w8a8_onnxruntime_reduce_range w8a8_onnxruntime; do
  "$bin" -q quantize "$root/examples/fashion_mnist/fashion_mnist_cnn.onnx" -c "$root/configs/$cfg.toml" \
    --calib "$data/train-images-idx3-ubyte.gz" --calib-count 512 -o "$out/$cfg.onnx" --report "$out/$cfg.json" \
    --eval-data "$data/t10k-images-idx3-ubyte.gz" --eval-labels "$data/t10k-labels-idx1-ubyte.gz" \
    --eval-outputs "$out/$cfg.npy" > "$out/$cfg.log" 2>&1
  echo "== $cfg on an emulated Haswell (no VNNI), first $count test images"
  status=0
  "$qemu" -cpu Haswell-v4 "$(command -v node)" "$here/evaluate.mjs" "$out/$cfg.onnx" "$data/t10k-images-idx3-ubyte.gz" \
    "$data/t10k-labels-idx1-ubyte.gz" --report "$out/$cfg.json" --sim "$out/$cfg.npy" --count "$count" --max-steps 1 \
    2> >(grep -v "TCG doesn.t support" >&2) || status=$?
  if [[ $cfg == w8a8_onnxruntime_reduce_range && $status -ne 0 ]]; then
    echo "FAIL: reduce-range weights do not match the simulation without VNNI"; exit 1
  fi
  if [[ $cfg == w8a8_onnxruntime && $status -eq 0 ]]; then
    echo "FAIL: full 8-bit weights matched: the emulated processor did not run the saturating kernels"; exit 1
  fi
  if [[ $cfg == w8a8_onnxruntime ]] && ! grep -q "can saturate" "$out/$cfg.log"; then
    echo "FAIL: the export did not warn about the layers that saturate"; exit 1
  fi
done
echo "ONNX Runtime without VNNI: reduce-range export matches the simulation; full 8-bit export saturates as warned"
