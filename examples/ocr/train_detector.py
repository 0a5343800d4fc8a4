#!/usr/bin/env python3
"""Train the bundled text detector and export it as ONNX (opset 11, dynamic batch and width).

A small UNet: three Conv+BN+ReLU stages down (MaxPool), two up (nearest Resize, Concat with the
skip, Conv), a 1x1 Conv and a Sigmoid: the probability that each pixel of a [N, 1, 64, W] page
crop is text, [N, 1, 64, W]. Trained with binary cross-entropy plus dice loss on pages from
pages.py. Deterministic for a seed and thread count; a few minutes on 2 cores.

    /usr/bin/python3 examples/ocr/train_detector.py --out examples/ocr/text_detector.onnx
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pages


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1, self.e2, self.e3 = block(1, 16), block(16, 32), block(32, 64)
        self.d2, self.d1 = block(64 + 32, 32), block(32 + 16, 16)
        self.out = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        e1 = self.e1(x)
        e2 = self.e2(F.max_pool2d(e1, 2))
        e3 = self.e3(F.max_pool2d(e2, 2))
        d2 = self.d2(torch.cat([F.interpolate(e3, scale_factor=2.0, mode="nearest"), e2], 1))
        d1 = self.d1(torch.cat([F.interpolate(d2, scale_factor=2.0, mode="nearest"), e1], 1))
        return torch.sigmoid(self.out(d1))


def batch(rng, size):
    w = int(rng.integers(12, 33)) * 8
    xs, ms = zip(*[pages.page(rng, w) for _ in range(size)])
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ms))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed + 200)
    model = Detector()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    start = time.time()
    for step in range(a.steps):
        model.train()
        x, m = batch(rng, 16)
        p = model(x)
        dice = 1 - (2 * (p * m).sum() + 1) / (p.sum() + m.sum() + 1)
        loss = F.binary_cross_entropy(p, m) + dice
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == a.steps - 1:
            model.eval()
            with torch.no_grad():
                x, m = batch(np.random.default_rng(7), 32)
                p = model(x) > 0.5
                iou = ((p & (m > 0.5)).sum() / ((p | (m > 0.5)).sum() + 1)).item()
            print("step %d loss %.4f IoU %.3f (%.0f s)" % (step, loss.item(), iou, time.time() - start), flush=True)
        if time.time() - start > a.minutes * 60:
            print("time budget reached at step %d" % step)
            break
    model.eval()
    example = torch.from_numpy(pages.page(np.random.default_rng(1), 128)[0][None])
    torch.onnx.export(model, example, a.out, opset_version=11, input_names=["page"], output_names=["text_prob"],
                      dynamic_axes={"page": {0: "N", 3: "W"}, "text_prob": {0: "N", 3: "W"}})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
