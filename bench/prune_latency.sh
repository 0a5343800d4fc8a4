#!/usr/bin/env bash
# ONNX Runtime latency before and after 30% and 50% structured pruning (configs/prune_channels_50.toml
# and a 30% copy), each also with round_to = 8 (kept channel counts multiples of 8), of the two
# Fashion-MNIST models (batch 32) and of resnet18 (torchvision, random weights, batch 1 at
# 224x224), as a Markdown table. The unpruned model is the baseline of each row group, timed in
# the same process, interleaved round by round (bench/ort_latency.mjs).
#   bench/prune_latency.sh SPARSEBIT_BINARY [WORK_DIR] [THREADS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
threads="${3:-1}"
mkdir -p "$work"
for r in 30 50; do
  sed "s/^ratio = 0.5/ratio = 0.$r/" "$root/configs/prune_channels_50.toml" > "$work/prune_$r.toml"
  sed "s/^ratio = 0.5/ratio = 0.$r/; s/^round_to = 1 /round_to = 8 /" "$root/configs/prune_channels_50.toml" > "$work/prune_${r}r8.toml"
done
[[ -f "$work/zoo/resnet18/model.onnx" ]] || /usr/bin/python3 "$root/tests/models/make_models.py" "$work/zoo" resnet18 > /dev/null
/usr/bin/python3 - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
np.save(f"{sys.argv[1]}/mnist.npy", rng.random((32, 1, 28, 28), dtype=np.float32))
np.save(f"{sys.argv[1]}/imagenet.npy", rng.standard_normal((1, 3, 224, 224), dtype=np.float32))
PY
echo "| model | pruned | parameters | MACs | ORT median ms | p90 ms | latency ratio |"
echo "|---|---|---|---|---|---|---|"
variants=(30 30r8 50 50r8)
for spec in "fashion_mnist_cnn:$root/examples/fashion_mnist/fashion_mnist_cnn.onnx:image:mnist:" \
            "fashion_mnist_mobilenet:$root/examples/fashion_mnist/fashion_mnist_mobilenet.onnx:image:mnist:" \
            "resnet18:$work/zoo/resnet18/model.onnx:$(cat "$work/zoo/resnet18/input_name"):imagenet:$work/zoo/resnet18/calib"; do
  IFS=: read -r name model input data calib <<< "$spec"
  models=("$model")
  for r in "${variants[@]}"; do
    "$bin" -q prune "$model" -c "$work/prune_$r.toml" ${calib:+--calib "$calib"} -o "$work/${name}_$r.onnx" --report "$work/${name}_$r.json"
    models+=("$work/${name}_$r.onnx")
  done
  node "$here/ort_latency.mjs" --input "$input=$work/$data.npy" --threads "$threads" --runs 100 "${models[@]}" \
    > "$work/${name}_latency.jsonl"
  /usr/bin/python3 - "$work" "$name" <<'PY'
import json, sys
work, name = sys.argv[1], sys.argv[2]
lat = [json.loads(l) for l in open(f"{work}/{name}_latency.jsonl")]
variants = ["30", "30r8", "50", "50r8"]
rep = {r: json.load(open(f"{work}/{name}_{r}.json")) for r in variants}
b = rep["30"]["before"]
print(f"| {name} | 0% | {b['parameters']:,} | {b['macs']:,} | {lat[0]['median_ms']:.3f} | {lat[0]['p90_ms']:.3f} | 1.00 |")
for k, r in enumerate(variants, 1):
    a = rep[r]["after"]
    label = r[:2] + "%" + (", round_to 8" if r.endswith("r8") else "")
    print(f"| {name} | {label} | {a['parameters']:,} ({a['parameters']/b['parameters']:.2f}) | {a['macs']:,} ({a['macs']/b['macs']:.2f}) "
          f"| {lat[k]['median_ms']:.3f} | {lat[k]['p90_ms']:.3f} | {lat[k]['ratio_to_baseline']:.2f} |")
PY
done
