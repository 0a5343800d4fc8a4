#!/usr/bin/env python3
"""Prints the docs/MODELS.md table from the result.json files check_model.sh wrote.

    python3 tests/models/models_table.py MODELS_DIR
"""
import json
import os
import sys

rows = []
for name in sorted(os.listdir(sys.argv[1])):
    path = os.path.join(sys.argv[1], name, "result.json")
    if os.path.exists(path):
        with open(path) as f:
            rows.append(json.load(f))
print("| model | nodes | quantized inputs | import ms | calibration s | FP32 parity (rel. error) "
      "| QDQ parity (output steps) | noise floor (steps) | ORT fused (steps) | cosine(INT8, FP32) "
      "| ORT FP32 ms | ORT INT8 ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['model']} | {r['nodes']} | {r['quantized_inputs']} | {r['import_ms']:.0f} | {r['calibration_s']:.2f} "
          f"| {r['fp32_rel_error']:.1e} | {r['qdq_steps']:.2f} | {r['noise_floor_steps']:.2f} "
          f"| {r['qdq_steps_fused']:.2f} | {r['cosine_int8_fp32']:.4f} | {r['ort_fp32_ms']:.1f} | {r['ort_int8_ms']:.1f} |")
