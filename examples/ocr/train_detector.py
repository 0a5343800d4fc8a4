#!/usr/bin/env python3
"""Train the bundled text detector and export it as ONNX (opset 11, dynamic batch and width).

Shaped like the segmentation detectors people deploy (DBNet with a MobileNetV3 backbone, as in
PP-OCR): inverted-residual blocks (expansion, depthwise, squeeze-excitation, linear projection,
residual Adds; ReLU early, hard-swish late) give features at 1/2, 1/4 and 1/8 of a [N, 1, 64, W]
page crop (W a multiple of 8); an FPN (1x1 lateral convolutions, nearest upsampling and Adds,
3x3 output convolutions, Concat at 1/2) and DB's probability head (3x3 Conv-BN-ReLU,
ConvTranspose-BN-ReLU back to full size, 1x1 Conv, Sigmoid) give the probability that each pixel
is text, [N, 1, 64, W]. Trained with binary cross-entropy plus dice loss on pages from pages.py.

    /usr/bin/python3 examples/ocr/train_detector.py --out examples/ocr/text_detector.onnx [--device cuda]

The bundled model was trained on one GPU with --device cuda --workers 6 (10000 steps of 32
pages); --save STATE.npz keeps the weights and --export-from STATE.npz exports them (opset 11)
with this file's torch.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pages
from ocr_blocks import ConvBNAct, InvertedResidual, parse_args, train_or_load


def up(x, factor):
    return F.interpolate(x, scale_factor=float(factor), mode="nearest")


class Detector(nn.Module):
    def __init__(self, inner=64):
        super().__init__()
        hs, relu = nn.Hardswish, nn.ReLU
        self.stem = ConvBNAct(1, 16, 3, 2)                                   # 1/2
        self.stage1 = InvertedResidual(16, 16, 16, 3, 1, True, relu)
        self.stage2 = nn.Sequential(InvertedResidual(16, 64, 24, 3, 2, False, relu),   # 1/4
                                    InvertedResidual(24, 72, 24, 3, 1, False, relu))
        self.stage3 = nn.Sequential(InvertedResidual(24, 96, 40, 5, 2, True, hs),      # 1/8
                                    InvertedResidual(40, 120, 40, 5, 1, True, hs),
                                    InvertedResidual(40, 120, 48, 5, 1, True, hs))
        self.lateral = nn.ModuleList([nn.Conv2d(c, inner, 1, bias=False) for c in (16, 24, 48)])
        self.smooth = nn.ModuleList([nn.Conv2d(inner, inner // 4, 3, padding=1, bias=False) for _ in range(3)])
        self.head = nn.Sequential(ConvBNAct(3 * inner // 4, 16, 3, act=nn.ReLU),
                                  nn.ConvTranspose2d(16, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 1, 1))

    def forward(self, x):
        c1 = self.stage1(self.stem(x))
        c2 = self.stage2(c1)
        c3 = self.stage3(c2)
        p3 = self.lateral[2](c3)
        p2 = self.lateral[1](c2) + up(p3, 2)
        p1 = self.lateral[0](c1) + up(p2, 2)
        f = torch.cat([self.smooth[0](p1), up(self.smooth[1](p2), 2), up(self.smooth[2](p3), 4)], 1)
        return torch.sigmoid(self.head(f))


def make_batch(rng, size=32):
    w = int(rng.integers(12, 33)) * 8
    xs, ms = zip(*[pages.page(rng, w) for _ in range(size)])
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ms))


def bce_dice(model, b):
    x, m = b
    p = model(x)
    dice = 1 - (2 * (p * m).sum() + 1) / (p.sum() + m.sum() + 1)
    return F.binary_cross_entropy(p, m) + dice


def iou(model, dev):
    x, m = make_batch(np.random.default_rng(7), 64)
    p = model(x.to(dev)).cpu() > 0.5
    return "IoU %.3f" % ((p & (m > 0.5)).sum() / ((p | (m > 0.5)).sum() + 1)).item()


def main():
    a = parse_args(__doc__, steps=5000, lr=2e-3)
    model = train_or_load(Detector(), make_batch, bce_dice, iou, a)
    if not a.out:
        return
    example = torch.from_numpy(pages.page(np.random.default_rng(1), 128)[0][None])
    torch.onnx.export(model, example, a.out, opset_version=11, input_names=["page"], output_names=["text_prob"],
                      dynamic_axes={"page": {0: "N", 3: "W"}, "text_prob": {0: "N", 3: "W"}})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
