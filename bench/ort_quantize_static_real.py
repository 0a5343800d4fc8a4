#!/usr/bin/env python3
"""ONNX Runtime's own static quantization of a real model, for bench/real_models.sh's baseline
rows (needs Python's onnxruntime, which the GPU machine has): QDQ, per-channel int8 weights,
uint8 or int8 activations, each calibration method, over the same .npy samples Sparsebit
calibrates on; runs each export on a stacked test input and saves its first output (or argmax
over the last axis) for tests/real_models/ppocr.py to score.

    ort_quantize_static_real.py MODEL.onnx CALIB_DIR TEST.npy OUT_DIR [--argmax] [--methods MinMax,...]
Prints one JSON line per method: seconds of quantize_static, and the output file.
"""
import argparse
import glob
import json
import os
import time

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_static)


class Samples(CalibrationDataReader):
    def __init__(self, folder, name):
        self.files = sorted(glob.glob(f"{folder}/*.npy"))
        self.name = name

    def get_next(self):
        return {self.name: np.load(self.files.pop(0))[None]} if self.files else None


def run(model, x, argmax):
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    outs = [s.run(None, {s.get_inputs()[0].name: x[i:i + 16]})[0] for i in range(0, len(x), 16)]
    y = np.concatenate(outs)
    return y.argmax(-1).astype(np.int32) if argmax else y.astype(np.float32)


ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("calib")
ap.add_argument("test")
ap.add_argument("out")
ap.add_argument("--argmax", action="store_true")
ap.add_argument("--methods", default="MinMax,Percentile,Entropy")
ap.add_argument("--activations", default="QUInt8")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
name = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"]).get_inputs()[0].name
x = np.load(a.test)
for method in a.methods.split(","):
    q = os.path.join(a.out, f"ort_{method}.onnx")
    t0 = time.perf_counter()
    quantize_static(a.model, q, Samples(a.calib, name), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=getattr(QuantType, a.activations), weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, method))
    seconds = time.perf_counter() - t0
    out = os.path.join(a.out, f"ort_{method}_{a.activations}.npy")
    np.save(out, run(q, x, a.argmax))
    os.remove(q)
    print(json.dumps({"method": method, "activations": a.activations, "seconds": seconds, "output": out}))
