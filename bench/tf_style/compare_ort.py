#!/usr/bin/env python3
"""Side by side with ONNX Runtime's own quantizer, in ONNX Runtime.

    compare_ort.py DIR SPARSEBIT_QDQ [SPARSEBIT_QDQ ...]

DIR is what make_tf_style.py wrote. Quantizes DIR/model.onnx with onnxruntime.quantization's
quantize_static (QDQ, MinMax calibration on DIR/calib; per-tensor and per-channel weights, its
defaults otherwise: int8 activations and weights) and runs the float model, those and the given Sparsebit exports on DIR/eval.
Prints, per model: the worst and mean cosine of the embedding to float, the largest and mean
absolute change of the scores, and whether the top class stays. Needs the onnxruntime Python
package (the GPU machine has it; bench/tf_style/run.sh).
"""
import glob
import json
import os
import sys

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static


def load(folder):
    return [np.load(f) for f in sorted(glob.glob(os.path.join(folder, "*.npy")))]


class Reader(CalibrationDataReader):
    def __init__(self, name, samples):
        self.items = iter([{name: s} for s in samples])

    def get_next(self):
        return next(self.items, None)


def run(path, name, samples):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = [s.run(["embedding", "scores"], {name: x}) for x in samples]
    return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])


def main():
    folder, ours = sys.argv[1], sys.argv[2:]
    name = open(os.path.join(folder, "input_name")).read().strip()
    model = os.path.join(folder, "model.onnx")
    calib, evals = load(os.path.join(folder, "calib")), load(os.path.join(folder, "eval"))
    candidates = {f"sparsebit {os.path.basename(p)}": p for p in ours}
    for per_channel in (False, True):
        out = os.path.join(folder, f"ort_minmax{'_per_channel' if per_channel else ''}.onnx")
        quantize_static(model, out, Reader(name, calib), quant_format=QuantFormat.QDQ, per_channel=per_channel)
        candidates[f"ONNX Runtime MinMax{', per-channel' if per_channel else ''}"] = out
    fe, fs = run(model, name, evals)
    rows = []
    for label, path in candidates.items():
        e, s = run(path, name, evals)
        cos = (e * fe).sum(1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(fe, axis=1))
        d = np.abs(s - fs)
        rows.append({"model": label, "worst_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                     "max_score_change": float(d.max()), "mean_score_change": float(d.mean()),
                     "top_class_kept": float((s.argmax(1) == fs.argmax(1)).mean())})
    print("| model | worst embedding cosine | mean | largest score change | mean | top class kept |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['worst_cosine']:.4f} | {r['mean_cosine']:.5f} | {r['max_score_change']:.4f} | "
              f"{r['mean_score_change']:.5f} | {100 * r['top_class_kept']:.1f}% |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
