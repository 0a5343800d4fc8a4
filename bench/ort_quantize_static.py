#!/usr/bin/env python3
"""ONNX Runtime's own static quantization, timed, as the baseline of bench/gpu_calibration.sh:
MinMax calibration, QDQ format, per-channel int8 weights, uint8 activations (ORT's defaults for
QDQ), over the same .npy batches Sparsebit calibrates on.

    ort_quantize_static.py MODEL.onnx DATA_DIR OUT.onnx INPUT_NAME
Prints one JSON line: seconds for quantize_static as a whole (calibration and writing).
"""
import glob
import json
import sys
import time

import numpy as np
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_static)


class Batches(CalibrationDataReader):
    def __init__(self, folder, name):
        self.files = sorted(glob.glob(f"{folder}/*.npy"))
        self.name = name

    def get_next(self):
        return {self.name: np.load(self.files.pop(0))} if self.files else None


model, data, out, name = sys.argv[1:5]
t0 = time.perf_counter()
quantize_static(model, out, Batches(data, name), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax)
print(json.dumps({"tool": "onnxruntime.quantization.quantize_static", "seconds": time.perf_counter() - t0}))
