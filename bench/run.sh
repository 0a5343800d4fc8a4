#!/usr/bin/env bash
# Calibration benchmark: the bundled Fashion-MNIST CNN and a ResNet-18-shaped model on 256
# samples, W8A8 (TensorRT rules), streaming and layerwise. Numbers go to bench/RESULTS.md.
#   bench/run.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
resnet="$build/bench/resnet18.onnx"
[[ -f "$resnet" ]] || /usr/bin/python3 "$root/bench/make_resnet18.py" "$resnet"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for mode in streaming layerwise; do
  "$build/bin/calibration_bench" "$root/examples/fashion_mnist/fashion_mnist_cnn.onnx" "$root/configs/w8a8_tensorrt.toml" \
    --samples 256 --batch 32 --mode "$mode"
done
for mode in streaming layerwise; do
  "$build/bin/calibration_bench" "$resnet" "$root/configs/w8a8_tensorrt.toml" --samples 256 --batch 32 --mode "$mode"
done
