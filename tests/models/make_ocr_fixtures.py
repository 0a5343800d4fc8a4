#!/usr/bin/env python3
"""Lays out the bundled OCR models (examples/ocr: the text recognizer, the CRNN recognizer with
its bidirectional LSTMs, and the text detector, trained and exported at opset 11 with dynamic batch and width) in the layout of make_models.py
(NAME/model.onnx, NAME/calib, NAME/eval, NAME/input_name), with data rendered by lines.py and
pages.py: calibration samples of many widths, one per .npy file, and an evaluation batch at a
width they do not share (with four copies perturbed by 1e-6, the noise floor of check_model.mjs).

    /usr/bin/python3 tests/models/make_ocr_fixtures.py OUT_DIR
"""
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OCR = os.path.join(HERE, "..", "..", "examples", "ocr")
sys.path.insert(0, OCR)

import lines  # noqa: E402
import pages  # noqa: E402


def lay_out(out, name, model, input_name, calib, eval_batch):
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "calib"), exist_ok=True)
    os.makedirs(os.path.join(d, "eval"), exist_ok=True)
    shutil.copyfile(os.path.join(OCR, model), os.path.join(d, "model.onnx"))
    with open(os.path.join(d, "input_name"), "w") as f:
        f.write(input_name)
    for i, x in enumerate(calib):
        np.save(os.path.join(d, "calib", "%03d.npy" % i), x)
    np.save(os.path.join(d, "eval", "000.npy"), eval_batch)
    for seed in range(2, 6):  # the noise floor of check_model.mjs: 1e-6 relative perturbations
        noise = np.random.default_rng(seed).standard_normal(eval_batch.shape).astype(np.float32)
        np.save(os.path.join(d, "eval", "%03d.npy" % (seed - 1)), eval_batch * (1 + noise * np.float32(1e-6)))


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(31)
    calib = [lines.render(lines.random_text(rng), rng) for _ in range(24)]
    test = np.stack([lines.render(lines.random_text(rng), rng, width=196) for _ in range(8)])
    lay_out(out, "ocr_recognizer", "text_recognizer.onnx", "line", calib, test)
    lay_out(out, "ocr_crnn", "crnn_recognizer.onnx", "line", calib, test)
    calib = [pages.page(rng)[0] for _ in range(12)]
    test = np.stack([pages.page(rng, 200)[0] for _ in range(4)])
    lay_out(out, "ocr_detector", "text_detector.onnx", "page", calib, test)


if __name__ == "__main__":
    main()
