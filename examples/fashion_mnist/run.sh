#!/usr/bin/env bash
# The main job: quantize the bundled Fashion-MNIST CNN to W8A8 for ONNX Runtime (calibrated on
# 512 training images; weights on ONNX Runtime's 7-bit reduce-range grid, so its integer kernels
# give the same numbers on x86 processors with and without VNNI), export QDQ ONNX, and evaluate it on the 10,000 test images three ways: FP32,
# Sparsebit's simulated INT8, and the exported model in ONNX Runtime.
#
#   examples/fashion_mnist/run.sh [SPARSEBIT_BINARY] [OUTPUT_DIR] [--check]
#
# --check exits non-zero when ONNX Runtime's outputs differ from the simulation by more than
# one output quantization step on any image, or INT8 accuracy is more than 0.5 points below FP32.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-$root/build/bin/sparsebit}"
out="${2:-$root/out/fashion_mnist}"
check=()
[[ "${3:-}" == "--check" ]] && check=(--max-steps 1 --max-drop 0.5)
data=/usr/share/datasets/fashion-mnist
mkdir -p "$out"

"$bin" quantize "$here/fashion_mnist_cnn.onnx" \
  -c "$root/configs/w8a8_onnxruntime_reduce_range.toml" \
  --calib "$data/train-images-idx3-ubyte.gz" --calib-count 512 \
  -o "$out/fashion_mnist_w8a8.onnx" --report "$out/report.json" \
  --eval-data "$data/t10k-images-idx3-ubyte.gz" --eval-labels "$data/t10k-labels-idx1-ubyte.gz" \
  --eval-outputs "$out/simulated_logits.npy"

node "$root/tests/ort/evaluate.mjs" "$out/fashion_mnist_w8a8.onnx" \
  "$data/t10k-images-idx3-ubyte.gz" "$data/t10k-labels-idx1-ubyte.gz" \
  --report "$out/report.json" --sim "$out/simulated_logits.npy" "${check[@]}"
