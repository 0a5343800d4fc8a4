#!/usr/bin/env bash
# The constant of the onnxruntime placement's cost model (Note [ONNX Runtime placement]): the time
# an integer kernel saves per multiply-add, against the time of one QuantizeLinear or
# DequantizeLinear pass over one element, both measured in ONNX Runtime (npm onnxruntime-node,
# CPU, one thread). Three models on a C x 56 x 56 input: a chain of 8 1x1 convolutions C -> C with
# Relu in float; the same chain with Q/DQ placed so that every convolution runs as QLinearConv;
# and 8 QuantizeLinear -> DequantizeLinear pairs with a Tanh after each (an op ONNX Runtime has no
# integer kernel for, so the pairs stay) against 8 Tanh alone: what the boundaries of a float
# layer between integer ones cost. Prints the medians and saved-per-MAC in Q/DQ element passes.
#   bench/placement_cost.sh [WORK_DIR] [CHANNELS] [RUNS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${1:-$(mktemp -d)}"
channels="${2:-64}"
runs="${3:-50}"
mkdir -p "$work"
/usr/bin/python3 - "$work" "$channels" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh

work, c = sys.argv[1], int(sys.argv[2])
hw, layers = 56, 8
rng = np.random.default_rng(0)
weights = [(rng.standard_normal((c, c, 1, 1)) * (1 / np.sqrt(c))).astype(np.float32) for _ in range(layers)]


def save(nodes, inits, name):
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.FLOAT, [1, c, hw, hw])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, c, hw, hw])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, f"{work}/{name}.onnx")


scalar = lambda name, v, t: nh.from_array(np.array(v, dtype=t), name)
nodes, inits, prev = [], [], "x"
for i, w in enumerate(weights):
    inits.append(nh.from_array(w, f"w{i}"))
    nodes += [h.make_node("Conv", [prev, f"w{i}"], [f"c{i}"]), h.make_node("Relu", [f"c{i}"], [f"r{i}" if i + 1 < layers else "y"])]
    prev = f"r{i}"
save(nodes, inits, "float")
# Every convolution between a DQ and a Q: ONNX Runtime fuses each into QLinearConv.
nodes, inits = [], [scalar("s", 0.05, np.float32), scalar("z", 0, np.uint8)]
nodes.append(h.make_node("QuantizeLinear", ["x", "s", "z"], ["q_in"]))
prev = "q_in"
for i, w in enumerate(weights):
    ws = (np.abs(w).reshape(c, -1).max(1) / 127).astype(np.float32)
    inits += [nh.from_array(np.round(w / ws[:, None, None, None]).astype(np.int8), f"wq{i}"), nh.from_array(ws, f"ws{i}"),
              nh.from_array(np.zeros(c, np.int8), f"wz{i}")]
    nodes += [h.make_node("DequantizeLinear", [prev, "s", "z"], [f"d{i}"]),
              h.make_node("DequantizeLinear", [f"wq{i}", f"ws{i}", f"wz{i}"], [f"wd{i}"], axis=0),
              h.make_node("Conv", [f"d{i}", f"wd{i}"], [f"c{i}"]), h.make_node("Relu", [f"c{i}"], [f"r{i}"]),
              h.make_node("QuantizeLinear", [f"r{i}", "s", "z"], [f"q{i}"])]
    prev = f"q{i}"
nodes.append(h.make_node("DequantizeLinear", [prev, "s", "z"], ["y"]))
save(nodes, inits, "integer")
# Q -> DQ pairs, a Tanh after each: what the boundaries of a float layer cost.
nodes, prev = [], "x"
for i in range(layers):
    nodes += [h.make_node("QuantizeLinear", [prev, "s", "z"], [f"q{i}"]), h.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"d{i}"]),
              h.make_node("Tanh", [f"d{i}"], [f"r{i}" if i + 1 < layers else "y"])]
    prev = f"r{i}"
save(nodes, [scalar("s", 0.01, np.float32), scalar("z", 128, np.uint8)], "qdq")
nodes = [h.make_node("Tanh", ["x" if i == 0 else f"r{i - 1}"], [f"r{i}" if i + 1 < layers else "y"]) for i in range(layers)]
save(nodes, [], "tanh")
np.save(f"{work}/x.npy", rng.standard_normal((1, c, hw, hw)).astype(np.float32))
PY
node "$here/ort_latency.mjs" --input "x=$work/x.npy" --runs "$runs" --threads 1 \
  "$work/float.onnx" "$work/integer.onnx" "$work/qdq.onnx" "$work/tanh.onnx" > "$work/times.jsonl"
/usr/bin/python3 - "$work/times.jsonl" "$channels" <<'PY'
import json, sys
t = [json.loads(l)["median_ms"] for l in open(sys.argv[1])]
c, hw, layers = int(sys.argv[2]), 56, 8
macs, elements = layers * c * c * hw * hw, layers * c * hw * hw
saved_ns_per_mac = (t[0] - t[1]) * 1e6 / macs
pass_ns = (t[2] - t[3]) * 1e6 / (2 * elements)  # a Q and a DQ per pair
print(f"C = {c}: float chain {t[0]:.2f} ms, integer chain {t[1]:.2f} ms, 8 Q/DQ pairs + Tanh {t[2]:.2f} ms, 8 Tanh {t[3]:.2f} ms")
print(f"saved per multiply-add {saved_ns_per_mac * 1000:.2f} ps, one Q or DQ pass {pass_ns * 1000:.1f} ps an element: "
      f"saved_per_mac = 1/{pass_ns / saved_ns_per_mac:.1f}")
PY
