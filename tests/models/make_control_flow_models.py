#!/usr/bin/env python3
"""Writes a model with data-dependent control flow, as torch.onnx exports a scripted module, in
the layout of make_models.py (NAME/model.onnx, NAME/calib, NAME/eval, NAME/input_name):

- if_loop_net: a convolution, then an If on the mean activation (a 3x3 convolution in one branch,
  a 1x1 in the other; both read their weights from the enclosing graph), then a Loop whose trip
  count is the input height / 8 (a residual refinement convolution per iteration, the
  loop-carried feature map), then a convolution head; torch.jit.script, opset 13, dynamic batch
  and size.

Calibration images are of two brightness levels and several sizes, so that both branches run
and the loop runs 2 to 4 times; the evaluation batch has a size none of them has.

    /usr/bin/python3 tests/models/make_control_flow_models.py OUT_DIR
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

from fixture_layout import write_layout


class IfLoopNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.wide = nn.Conv2d(8, 8, 3, padding=1)
        self.narrow = nn.Conv2d(8, 8, 1)
        self.refine = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        f = torch.relu(self.stem(x))
        if bool(f.mean() > 0.3):
            f = torch.relu(self.wide(f))
        else:
            f = torch.relu(self.narrow(f)) * 2.0
        for _ in range(x.shape[2] // 8):
            f = f + 0.5 * torch.relu(self.refine(f))
        return self.head(f)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    torch.manual_seed(0)
    model = torch.jit.script(IfLoopNet().eval())
    folder = os.path.join(out, "if_loop_net")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    torch.onnx.export(model, torch.rand(1, 3, 16, 16), path, opset_version=13, input_names=["image"],
                      output_names=["y"], dynamic_axes={"image": {0: "batch", 2: "h", 3: "w"}, "y": {0: "batch"}})
    rng = np.random.default_rng(3)
    calib = [(rng.random((1, 3, s, s), dtype=np.float32) * level).astype(np.float32)
             for s in (16, 24, 32) for level in (0.2, 1.0, 2.0)]
    write_layout(folder, calib, rng.random((2, 3, 20, 20), dtype=np.float32) * np.float32(1.5), "image")
    print(f"if_loop_net: {path}")


if __name__ == "__main__":
    main()
