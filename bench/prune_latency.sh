#!/usr/bin/env bash
# ONNX Runtime latency before and after 30% and 50% structured pruning (configs/prune_channels_50.toml
# and a 30% copy) of the two Fashion-MNIST models (batch 32) and of resnet18 (torchvision, random
# weights, batch 1 at 224x224), as a Markdown table. The unpruned model is the baseline of each
# row group, timed in the same process (bench/ort_latency.mjs).
#   bench/prune_latency.sh SPARSEBIT_BINARY [WORK_DIR] [THREADS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$1"
work="${2:-$(mktemp -d)}"
threads="${3:-2}"
mkdir -p "$work"
sed 's/^ratio = 0.5/ratio = 0.3/' "$root/configs/prune_channels_50.toml" > "$work/prune_30.toml"
cp "$root/configs/prune_channels_50.toml" "$work/prune_50.toml"
[[ -f "$work/zoo/resnet18/model.onnx" ]] || /usr/bin/python3 "$root/tests/models/make_models.py" "$work/zoo" resnet18 > /dev/null
/usr/bin/python3 - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
np.save(f"{sys.argv[1]}/mnist.npy", rng.random((32, 1, 28, 28), dtype=np.float32))
np.save(f"{sys.argv[1]}/imagenet.npy", rng.standard_normal((1, 3, 224, 224), dtype=np.float32))
PY
echo "| model | pruned | parameters | MACs | ORT median ms | p90 ms | latency ratio |"
echo "|---|---|---|---|---|---|---|"
for spec in "fashion_mnist_cnn:$root/examples/fashion_mnist/fashion_mnist_cnn.onnx:image:mnist" \
            "fashion_mnist_mobilenet:$root/examples/fashion_mnist/fashion_mnist_mobilenet.onnx:image:mnist" \
            "resnet18:$work/zoo/resnet18/model.onnx:$(cat "$work/zoo/resnet18/input_name" 2>/dev/null || echo x):imagenet"; do
  IFS=: read -r name model input data <<< "$spec"
  for r in 30 50; do
    "$bin" -q prune "$model" -c "$work/prune_$r.toml" -o "$work/${name}_$r.onnx" --report "$work/${name}_$r.json"
  done
  node "$here/ort_latency.mjs" --input "$input=$work/$data.npy" --threads "$threads" --runs 40 \
    "$model" "$work/${name}_30.onnx" "$work/${name}_50.onnx" > "$work/${name}_latency.jsonl"
  /usr/bin/python3 - "$work" "$name" <<'PY'
import json, sys
work, name = sys.argv[1], sys.argv[2]
lat = [json.loads(l) for l in open(f"{work}/{name}_latency.jsonl")]
rep = {r: json.load(open(f"{work}/{name}_{r}.json")) for r in (30, 50)}
b = rep[30]["before"]
print(f"| {name} | 0% | {b['parameters']:,} | {b['macs']:,} | {lat[0]['median_ms']:.3f} | {lat[0]['p90_ms']:.3f} | 1.00 |")
for k, r in ((1, 30), (2, 50)):
    a = rep[r]["after"]
    print(f"| {name} | {r}% | {a['parameters']:,} ({a['parameters']/b['parameters']:.2f}) | {a['macs']:,} ({a['macs']/b['macs']:.2f}) "
          f"| {lat[k]['median_ms']:.3f} | {lat[k]['p90_ms']:.3f} | {lat[k]['ratio_to_baseline']:.2f} |")
PY
done
