#!/usr/bin/env bash
# Builds this template against an installed Sparsebit, quantizes its model with the installed
# `sparsebit` (loading the plugin through example.toml's [plugins] paths), and runs the export in
# ONNX Runtime, which must reproduce Sparsebit's simulated outputs.
#   run.sh PREFIX [WORK_DIR]
# PREFIX is where `cmake --install` put Sparsebit. The template is copied to WORK_DIR (default: a
# temporary folder) and built there, as a vendor would build it outside our tree.
set -euo pipefail
prefix="$(cd "$1" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${2:-$(mktemp -d)}"
mkdir -p "$work"
cp -r "$here"/CMakeLists.txt "$here"/src "$here"/tests "$here"/model "$here"/example.toml "$work"/
cmake -S "$work" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
ctest --test-dir "$work/build" --output-on-failure

"$prefix/bin/sparsebit" plugins -c "$work/example.toml" | grep -A1 "example.template"
"$prefix/bin/sparsebit" quantize "$work/model/layer_scale_mlp.onnx" -c "$work/example.toml" \
  --calib "$work/model/calib" -o "$work/layer_scale_mlp_int8.onnx" --report "$work/report.json" \
  --eval-data "$work/model/eval.npy" --eval-outputs "$work/simulated.npy"
# ORT stands in for the NPU: at 'basic' it runs the Q/DQ nodes as written, on every x86 processor
# (its fused integer kernels would add their own saturation on processors without VNNI).
node "$root/tests/ort/run_model.mjs" "$work/layer_scale_mlp_int8.onnx" --in "x=$work/model/eval.npy" \
  --out "y=$work/ort.npy" --compare "y=$work/simulated.npy" --atol 1e-5 --optimization basic
