#!/usr/bin/env python3
"""Writes detection-style test models that end in the ops of the second coverage round, as
torch.onnx exports them, in the layout of make_models.py (NAME/model.onnx, NAME/calib, NAME/eval,
NAME/input_name):

- nms_head: a small single-shot detector (conv backbone, a box-regression and a score branch over
  an 8x8 grid of anchors) whose outputs go through torchvision's nms (NonMaxSuppression, then the
  Gather/Squeeze chain the exporter writes); the output is the kept boxes' scores in kept order;
  opset 11, one 64x64 image.
- grid_sample: a deformable-style block: a convolution predicts a per-pixel offset field, added
  to the identity grid, and F.grid_sample (GridSample-16) resamples the features, followed by a
  convolution head; opset 16, dynamic size.

Weights are random at PyTorch's default scale; calibration samples are images (of a few sizes
for grid_sample, one per .npy file); grid_sample's evaluation batch has a size none of them has.

    /usr/bin/python3 tests/models/make_detection_models.py OUT_DIR [NAME ...]
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from fixture_layout import write_layout

ALL = ["nms_head", "grid_sample"]


class NmsHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                                      nn.Conv2d(32, 32, 3, 2, 1), nn.ReLU())  # 64x64 -> 8x8
        self.box = nn.Conv2d(32, 4, 1)
        self.score = nn.Conv2d(32, 1, 1)

    def forward(self, x):  # x: [1, 3, 64, 64]
        f = self.backbone(x)
        n = f.shape[2] * f.shape[3]
        ys, xs = torch.meshgrid(torch.arange(8, dtype=torch.float32), torch.arange(8, dtype=torch.float32),
                                indexing="ij")
        centers = torch.stack([xs, ys], -1).reshape(n, 2) * 4 + 2  # anchor centres on a 32x32 canvas
        d = self.box(f).reshape(4, n).t()
        boxes = torch.cat([centers - 3 - d[:, :2].abs() * 4, centers + 3 + d[:, 2:].abs() * 4], 1)
        scores = torch.sigmoid(self.score(f).reshape(n))
        keep = torchvision.ops.nms(boxes, scores, 0.3)
        return scores[keep]


class GridSampleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU())
        self.offsets = nn.Conv2d(16, 2, 3, 1, 1)
        self.head = nn.Conv2d(16, 8, 3, 1, 1)

    def forward(self, x):
        f = self.features(x)
        n, _, h, w = f.shape
        # the identity grid (pixel centres in [-1, 1], align_corners = False), from the runtime size
        xs = (torch.arange(w, dtype=torch.float32) * 2 + 1) / w - 1
        ys = (torch.arange(h, dtype=torch.float32) * 2 + 1) / h - 1
        base = torch.stack([xs.unsqueeze(0).expand(h, w), ys.unsqueeze(1).expand(h, w)], -1).unsqueeze(0)
        grid = base + 0.1 * torch.tanh(self.offsets(f)).permute(0, 2, 3, 1)
        return self.head(F.grid_sample(f, grid, mode="bilinear", padding_mode="border", align_corners=False))


def export(name, out):
    torch.manual_seed(ALL.index(name))
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(40 + ALL.index(name))
    if name == "nms_head":
        model, opset, sizes, eval_size, batch = NmsHead(), 11, (64, 64, 64, 64), 64, 1
    else:
        model, opset, sizes, eval_size, batch = GridSampleNet(), 16, (16, 24, 32, 40), 28, 2
    model.eval()
    make = lambda n, s: rng.random((n, 3, s, s), dtype=np.float32)
    path = os.path.join(folder, "model.onnx")
    axes = {"image": {0: "batch", 2: "h", 3: "w"}} if name == "grid_sample" else None
    torch.onnx.export(model, torch.from_numpy(make(1, sizes[0])), path, opset_version=opset, input_names=["image"],
                      output_names=["y"], dynamic_axes=axes)
    write_layout(folder, [make(1, s) for s in sizes + sizes], make(batch, eval_size), "image")
    print(f"{name}: {path}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for name in sys.argv[2:] or ALL:
        if name not in ALL:
            sys.exit(f"unknown model {name}; one of {', '.join(ALL)}")
        export(name, sys.argv[1])


if __name__ == "__main__":
    main()
