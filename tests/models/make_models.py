#!/usr/bin/env python3
"""Exports the real-architecture test models to ONNX: torchvision's classification models plus
a torch.nn.TransformerEncoder text encoder and a UNet-style model, with random weights (fixed
seed, nothing downloaded), and writes calibration/evaluation samples for each.

    /usr/bin/python3 tests/models/make_models.py OUT_DIR [NAME ...]

For every model NAME this writes OUT_DIR/NAME/model.onnx (opset 17, dynamic batch and, for the
convolutional models, dynamic spatial dims), OUT_DIR/NAME/calib/*.npy (calibration samples) and
OUT_DIR/NAME/eval/000.npy (one evaluation batch, at another size where the model allows it; for
float inputs eval/001-004.npy are the same batch perturbed by 1e-6, see export())
and OUT_DIR/NAME/input_name.
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.models as tvm

OPSET = 17


class TextEncoder(nn.Module):
    """Token embedding + learned positions + nn.TransformerEncoder + mean-pooled classifier."""

    def __init__(self, vocab=1000, dim=128, heads=4, layers=2, classes=10, max_len=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.encoder(x).mean(dim=1))


class UNet(nn.Module):
    """Two-level UNet: strided conv down, ConvTranspose and Resize (bilinear) up, skip Concats."""

    def __init__(self, cin=3, width=16, classes=4):
        super().__init__()

        def block(a, b):
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(inplace=True))

        self.enc1 = block(cin, width)
        self.enc2 = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(inplace=True))
        self.enc3 = nn.Sequential(nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1), nn.ReLU(inplace=True))
        self.up3 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.dec1 = block(3 * width, width)
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        d2 = self.dec2(torch.cat([self.up3(self.enc3(e2)), e2], 1))
        d1 = F.interpolate(d2, size=e1.shape[2:], mode="bilinear", align_corners=False)
        return self.out(self.dec1(torch.cat([d1, e1], 1)))


# name -> (constructor, calibration input shape, evaluation input shape or None if fixed-size)
VISION = {
    "resnet18": (lambda: tvm.resnet18(), (3, 224, 224), (3, 160, 192)),
    "resnet50": (lambda: tvm.resnet50(), (3, 224, 224), (3, 160, 192)),
    "mobilenet_v2": (lambda: tvm.mobilenet_v2(), (3, 224, 224), (3, 160, 192)),
    "mobilenet_v3_small": (lambda: tvm.mobilenet_v3_small(), (3, 224, 224), (3, 160, 192)),
    "efficientnet_b0": (lambda: tvm.efficientnet_b0(), (3, 224, 224), (3, 160, 192)),
    "regnet_x_400mf": (lambda: tvm.regnet_x_400mf(), (3, 224, 224), (3, 160, 192)),
    "shufflenet_v2_x1_0": (lambda: tvm.shufflenet_v2_x1_0(), (3, 224, 224), (3, 160, 192)),
    "squeezenet1_1": (lambda: tvm.squeezenet1_1(), (3, 224, 224), (3, 160, 192)),
    "densenet121": (lambda: tvm.densenet121(), (3, 224, 224), (3, 160, 192)),
    "convnext_tiny": (lambda: tvm.convnext_tiny(), (3, 224, 224), (3, 160, 192)),
    "vit_b_16": (lambda: tvm.vit_b_16(), (3, 224, 224), None),
    "swin_t": (lambda: tvm.swin_t(), (3, 224, 224), None),
    "unet": (lambda: UNet(), (3, 64, 64), (3, 96, 80)),
}
ALL = list(VISION) + ["text_encoder"]
# Benchmark-only (bench/deploy_latency.sh), not in the test zoo: a BERT-small-shaped encoder
# (512 wide, 8 heads, 4 layers, 128 tokens), where the matrix products dominate as in BERT.
BENCH = {"bert_encoder": dict(vocab=8000, dim=512, heads=8, layers=4, max_len=128)}


def randomize(model, gen):
    """Random BN statistics and affine parameters, so that folding and calibration see real ranges;
    layers that torchvision initialises to zero (ViT's classifier head) get random weights."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)) and not m.weight.any():
            m.weight.data.copy_(torch.randn(m.weight.shape, generator=gen) * 0.02)
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def save_samples(folder, arrays):
    os.makedirs(folder, exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(os.path.join(folder, f"{i:03d}.npy"), a)


def export(name, out_dir):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    if name == "text_encoder":
        model = TextEncoder().eval()
        example = torch.randint(0, 1000, (1, 32), generator=gen)
        axes = {"tokens": {0: "batch", 1: "length"}, "logits": {0: "batch"}}
        calib = [torch.randint(0, 1000, (32,), generator=gen).numpy() for _ in range(8)]
        evaluation = [torch.randint(0, 1000, (2, 48), generator=gen).numpy()]
        in_name, out_name = "tokens", "logits"
    elif name in BENCH:
        shape = BENCH[name]
        model = TextEncoder(**shape).eval()
        tokens = shape["max_len"]
        example = torch.randint(0, shape["vocab"], (1, tokens), generator=gen)
        axes = {"tokens": {0: "batch"}, "logits": {0: "batch"}}
        calib = [torch.randint(0, shape["vocab"], (tokens,), generator=gen).numpy() for _ in range(8)]
        evaluation = [torch.randint(0, shape["vocab"], (2, tokens), generator=gen).numpy()]
        in_name, out_name = "tokens", "logits"
    else:
        make, shape, eval_shape = VISION[name]
        model = make().eval()
        with torch.no_grad():
            randomize(model, gen)
        example = torch.randn(1, *shape, generator=gen)
        dyn = {0: "batch"} if eval_shape is None else {0: "batch", 2: "height", 3: "width"}
        axes = {"input": dyn, "output": {0: "batch"}}
        calib = [torch.randn(*shape, generator=gen).numpy() for _ in range(8)]
        evaluation = [torch.randn(2, *(eval_shape or shape), generator=gen).numpy()]
        in_name, out_name = "input", "output"
    # Exported with autograd on: PyTorch's fused attention fast path (which has no ONNX export)
    # is skipped when parameters require grad.
    torch.onnx.export(model, example, path, opset_version=OPSET, input_names=[in_name], output_names=[out_name],
                      dynamic_axes=axes, do_constant_folding=True)
    with open(os.path.join(folder, "input_name"), "w") as f:
        f.write(in_name)
    save_samples(os.path.join(folder, "calib"), calib)
    # eval/001-004.npy repeat the batch with 1e-6 relative perturbations: how far the simulated
    # outputs move under them is the noise floor that float rounding differences alone produce.
    if evaluation[0].dtype == np.float32:
        for seed in range(2, 6):
            noise = np.random.default_rng(seed).standard_normal(evaluation[0].shape).astype(np.float32)
            evaluation.append(evaluation[0] * (1 + noise * np.float32(1e-6)))
    save_samples(os.path.join(folder, "eval"), evaluation)
    print(f"{name}: {path}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    names = sys.argv[2:] or ALL
    for n in names:
        if n not in ALL and n not in BENCH:
            sys.exit(f"unknown model {n}; known: {' '.join(ALL + list(BENCH))}")
        export(n, sys.argv[1])


if __name__ == "__main__":
    main()
