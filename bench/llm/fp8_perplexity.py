#!/usr/bin/env python3
"""W8A8 INT8 against FP8 on a byte-level language model: held-out perplexity in Sparsebit's
simulation, and of the exported model in ONNX Runtime (CPU, 'basic' optimizations for float8 Q/DQ)
and in Sparsebit's executor (the export read back: bench/llm/gpu_perplexity on the CPU).

    fp8_perplexity.py LM_DIR [--build BUILD_DIR]

LM_DIR is what make_tiny_lm.py wrote. Schemes (backend tensorrt: per-channel weights, per-tensor
activations, minmax ranges, attention scores float): INT8, FP8 E4M3 and FP8 E5M2. Prints a Markdown
table.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from perplexity import ROOT, LanguageModel, ort_perplexity, perplexity  # noqa: E402


def table(kind):
    return {"type": kind, "qscheme": "per-channel-symmetric", "observer": "minmax"}


def schemes():
    act = lambda kind: dict(table(kind), qscheme="per-tensor-symmetric")  # noqa: E731
    return [
        ("INT8", {"w": table("int"), "a": act("int")}),
        ("FP8 E4M3", {"w": table("fp8_e4m3"), "a": act("fp8_e4m3")}),
        ("FP8 E5M2", {"w": table("fp8_e5m2"), "a": act("fp8_e5m2")}),
    ]


def executor_perplexity(build, model, eval_dir):
    cmd = [os.path.join(build, "bin", "gpu_perplexity"), model, eval_dir, "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["perplexity"], result["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lm_dir")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    lm = LanguageModel(a.lm_dir, a.build)
    sparsebit, model, model_path, calib, eval_dir, tokens = (lm.sparsebit, lm.model, lm.model_path, lm.calib,
                                                             lm.eval_dir, lm.tokens)
    fp_ppl = lm.fp32_perplexity
    print("| scheme | Sparsebit simulation | ONNX Runtime | Sparsebit executor | increase over FP32 | "
          "executor s (x INT8's) |\n|---|---:|---:|---:|---:|---:|")
    ours, seconds = executor_perplexity(a.build, model_path, eval_dir)
    print(f"| FP32 | {fp_ppl:.4f} | {ort_perplexity(model_path, eval_dir):.4f} | {ours:.4f} | | {seconds:.2f} |")
    int8_seconds = None
    work = os.path.join(a.lm_dir, "fp8")
    os.makedirs(work, exist_ok=True)
    for name, cfg in schemes():
        # The causal mask adds -inf to the attention scores: those stay float, as in TensorRT's
        # fused attention (the INT8 placement would otherwise quantize the Softmax input).
        config = dict(cfg, backend="tensorrt", schedule={"float_attention_scores": True})
        qm = sparsebit.QuantModel(model, sparsebit.Config(config), calib=calib)
        qm.calibrate(calib)
        sim = perplexity(np.asarray(qm.forward(tokens, quantized=True)), tokens)
        path = os.path.join(work, name.replace(" ", "_").lower() + ".onnx")
        qm.export(path)
        ort = ort_perplexity(path, eval_dir, optimization="basic")
        ours, seconds = executor_perplexity(a.build, path, eval_dir)
        int8_seconds = int8_seconds or seconds  # INT8 comes first: the baseline
        print(f"| {name} | {sim:.4f} | {ort:.4f} | {ours:.4f} | {sim - fp_ppl:+.4f} | "
              f"{seconds:.2f} ({seconds / int8_seconds:.2f}x) |")


if __name__ == "__main__":
    main()
