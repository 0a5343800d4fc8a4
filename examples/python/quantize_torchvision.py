#!/usr/bin/env python3
"""Export a torchvision model with torch.onnx.export and quantize it to W8A8 in the same script.

    PYTHONPATH=build/python python3 examples/python/quantize_torchvision.py [OUT_DIR]

The model has random weights (no downloads here); with a trained one, replace `images()` by your
own loader, e.g. `(x.numpy() for x, _ in torch_loader)`. Prints the simulated model's agreement
with the float one and writes OUT_DIR/resnet18_w8a8.onnx (QDQ, for ONNX Runtime).
"""

import os
import sys

import numpy as np
import torch
import torchvision

import sparsebit

out = sys.argv[1] if len(sys.argv) > 1 else "out/python_example"
os.makedirs(out, exist_ok=True)

# 1. Export: dynamic batch, opset 13.
torch.manual_seed(0)
net = torchvision.models.resnet18(num_classes=10).eval()
float_path = os.path.join(out, "resnet18.onnx")
torch.onnx.export(net, torch.randn(1, 3, 224, 224), float_path, opset_version=13,
                  input_names=["image"], output_names=["logits"],
                  dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})


# 2. Calibration data: any iterable of numpy arrays (one sample [3, 224, 224] or a batch).
def images(count=64, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield rng.standard_normal((3, 224, 224), dtype=np.float32)


# 3. Quantize: the same config keys as the TOML files, here as a dict.
config = sparsebit.Config({
    "backend": "onnxruntime",
    # reduce_range: weights on a 7-bit grid, which ONNX Runtime's integer kernels run alike on
    # x86 processors with and without VNNI.
    "w": {"qscheme": "per-channel-symmetric", "bits": 8, "observer": "minmax", "reduce_range": True},
    "a": {"qscheme": "per-tensor-affine", "bits": 8, "observer": "percentile"},
    "calibration": {"batch_size": 16},
})
qm = sparsebit.QuantModel(sparsebit.load(float_path), config)
qm.calibrate(images(), progress=lambda done, total: print(f"\rcalibrated {done} samples", end=""))
print()

# 4. Check the simulated quantized model against torch's float one, then export.
x = np.stack(list(images(8, seed=1)))
with torch.no_grad():
    reference = net(torch.from_numpy(x)).numpy()
simulated = qm.forward(x)
cosine = (simulated * reference).sum() / np.sqrt((simulated ** 2).sum() * (reference ** 2).sum())
print(f"float vs simulated W8A8: cosine {cosine:.5f}, top-1 agreement "
      f"{(simulated.argmax(1) == reference.argmax(1)).mean():.0%}")
qdq_path = os.path.join(out, "resnet18_w8a8.onnx")
qm.export(qdq_path)
print(f"wrote {qdq_path}")
