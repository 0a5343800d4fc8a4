#!/usr/bin/env bash
# Prunes one exported real-architecture model three ways and checks each:
#   structured 50% (configs/prune_channels_50.toml): fewer parameters, and in ONNX Runtime the
#     shrunk model's output equals the masked model's (check_prune.mjs), at the evaluation size
#     (not the calibration size the channels were analysed at);
#   2:4 and unstructured 50%: the weights, by check_sparsity.py (onnx package only).
#   tests/models/check_prune.sh SPARSEBIT_BINARY MODELS_DIR NAME
# Each written model is removed once checked (SPARSEBIT_KEEP_TEST_OUTPUTS=1 keeps them): a ViT-B/16
# leaves four of ~330 MB.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$1"
dir="$2/$3"
[[ -f "$dir/model.onnx" ]] || { echo "$dir/model.onnx is missing: run tests/models/make_models.py $2 $3" >&2; exit 1; }
out="$dir/prune"
mkdir -p "$out"
input=$(cat "$dir/input_name")
done_with() { [[ "${SPARSEBIT_KEEP_TEST_OUTPUTS:-0}" == 1 ]] || rm -f "$@"; }

"$bin" -q prune "$dir/model.onnx" -c "$root/configs/prune_channels_50.toml" --calib "$dir/calib" \
  -o "$out/channels.onnx" --masked "$out/masked.onnx" --report "$out/channels.json"
/usr/bin/python3 - "$out/channels.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["channels_removed"] > 0, "no channel removed"
# Not "<": an exporter that stored identical layers once gets one smaller copy per layer.
assert r["after"]["parameters"] <= r["before"]["parameters"], "the model grew"
assert r["after"]["macs"] < r["before"]["macs"], "no MAC removed"
print(f"parameters {r['before']['parameters']} -> {r['after']['parameters']}, "
      f"MACs {r['before']['macs']} -> {r['after']['macs']}, {r['channels_removed']} channels")
PY
node "$here/check_prune.mjs" --float "$dir/model.onnx" --pruned "$out/channels.onnx" --masked "$out/masked.onnx" \
  --input "$input=$dir/eval/000.npy" --result "$out/ort.json"
done_with "$out/channels.onnx" "$out/masked.onnx"

"$bin" -q prune "$dir/model.onnx" -c "$root/configs/prune_2_4.toml" --calib "$dir/calib" -o "$out/2_4.onnx"
/usr/bin/python3 "$here/check_sparsity.py" "$dir/model.onnx" "$out/2_4.onnx" --nm 2:4
done_with "$out/2_4.onnx"
"$bin" -q prune "$dir/model.onnx" -c "$root/configs/prune_unstructured_50.toml" --calib "$dir/calib" -o "$out/u50.onnx"
/usr/bin/python3 "$here/check_sparsity.py" "$dir/model.onnx" "$out/u50.onnx" --ratio 0.5
done_with "$out/u50.onnx"
