#!/usr/bin/env python3
"""Compares the quantizer parameters of two `sparsebit quantize --report` files (CPU and GPU runs
of the same model, config and data): every quantized input must be present in both, zero points
equal, scales equal within REL (relative). Prints the largest difference and exits 1 if any
exceeds it.

    compare_reports.py CPU.json GPU.json [REL]
"""
import json
import sys


def slots(path):
    r = json.load(open(path))
    return {(q["node"], q["input_index"]): q for q in r["quantized_inputs"]}


def flat(v):
    return [x for y in v for x in flat(y)] if isinstance(v, list) else [v]


a, b = slots(sys.argv[1]), slots(sys.argv[2])
rel = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-6
assert a.keys() == b.keys(), f"different quantized inputs: {set(a) ^ set(b)}"
worst, exact, total = 0.0, 0, 0
for k in a:
    sa, sb = flat(a[k].get("scale")), flat(b[k].get("scale"))
    za, zb = flat(a[k].get("zero_point")), flat(b[k].get("zero_point"))
    assert za == zb, f"{k}: zero points differ"
    assert len(sa) == len(sb), f"{k}: {len(sa)} vs {len(sb)} scales"
    for x, y in zip(sa, sb):
        if x is None or y is None:
            continue
        total += 1
        exact += x == y
        worst = max(worst, abs(x - y) / max(abs(x), 1e-30))
print(f"{len(a)} quantized inputs, {total} scales: {exact} bit-identical, largest relative difference {worst:.3g}")
sys.exit(0 if worst <= rel else 1)
