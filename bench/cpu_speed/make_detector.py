#!/usr/bin/env python3
"""A segmentation-style detector for the profiler timing of bench/cpu_speed/run.sh: torchvision's
DeepLabV3 with a MobileNetV3-Large backbone (261 ONNX nodes, 11 M parameters, random weights,
seeded), exported at opset 13 with a dynamic batch, and COUNT random 3x320x320 inputs.

    /usr/bin/python3 bench/cpu_speed/make_detector.py OUT.onnx DATA_DIR COUNT
"""
import os
import sys

import numpy as np
import torch
import torchvision


def main():
    out, data, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    m = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None).eval()

    class Logits(torch.nn.Module):  # the dict output as one tensor
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)["out"]

    tmp = out + ".tmp"
    torch.onnx.export(Logits(m), torch.rand(1, 3, 320, 320), tmp, opset_version=13, input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}})
    os.replace(tmp, out)
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(count):
        np.save(os.path.join(data, "%03d.npy" % i), rng.random((3, 320, 320), dtype=np.float32))


if __name__ == "__main__":
    main()
