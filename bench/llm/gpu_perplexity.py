#!/usr/bin/env python3
"""Perplexity of the exports of bench/llm/perplexity.py computed on the GPU by Sparsebit's executor
(bench/llm/gpu_perplexity.cpp: MatMulNBits through the CUDA plugin's 4-bit kernels, blocked
DequantizeLinear through ATen), beside ONNX Runtime's figures on the CPU from the same files.

    gpu_perplexity.py LM_DIR [--build BUILD_DIR] [--device cuda] [--check TOLERANCE]

LM_DIR holds what perplexity.py wrote: model.onnx, eval/, quantized/*.onnx and results.json (the
ONNX Runtime perplexities; run perplexity.py where ONNX Runtime is, then copy LM_DIR here).
Prints a Markdown table; --check fails when a GPU perplexity differs from ONNX Runtime's by more
than TOLERANCE (relative).
"""
import argparse
import json
import os
import subprocess
import sys


def tag_of(name):  # as perplexity.py names its exports
    return name.replace(" ", "_").replace("+", "").replace("__", "_").lower()


def run(build, model, eval_dir, device, kernels=True):
    cmd = [os.path.join(build, "bin", "gpu_perplexity"), model, eval_dir, "--device", device]
    if not kernels:
        cmd.append("--no-kernels")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lm_dir")
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--check", type=float)
    a = ap.parse_args()
    results = json.load(open(os.path.join(a.lm_dir, "results.json")))
    eval_dir = os.path.join(a.lm_dir, "eval")
    print("| method | format | ONNX Runtime (CPU) | Sparsebit on " + a.device + " | relative difference | s | "
          "ATen reference s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    failures = []
    for row in results["rows"]:
        if row["method"] == "FP32":
            models = [("float", os.path.join(a.lm_dir, "model.onnx"), row["ort_dq"])]
        else:
            base = os.path.join(a.lm_dir, "quantized", tag_of(row["method"]))
            models = [("MatMulNBits", base + "_matmul_nbits.onnx", row["ort_nbits"]),
                      ("DequantizeLinear", base + "_dq.onnx", row["ort_dq"])]
        for fmt, path, ort in models:
            ours = run(a.build, path, eval_dir, a.device)
            ref = run(a.build, path, eval_dir, a.device, kernels=False)
            rel = abs(ours["perplexity"] / ort - 1)
            print(f"| {row['method']} | {fmt} | {ort:.6f} | {ours['perplexity']:.6f} | {rel:.1e} | "
                  f"{ours['seconds']:.2f} | {ref['seconds']:.2f} |")
            if a.check is not None and rel > a.check:
                failures.append(f"{row['method']} {fmt}: {ours['perplexity']:.6f} against {ort:.6f}")
    if failures:
        sys.exit("check failed: " + "; ".join(failures))
    if a.check is not None:
        print("check passed")


if __name__ == "__main__":
    main()
