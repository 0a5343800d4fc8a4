#!/usr/bin/env python3
"""Train the bundled Fashion-MNIST CNN and export it as ONNX (opset 13, dynamic batch).

Uses Debian's python3-torch and python3-onnx and the IDX files of the Debian package
dataset-fashion-mnist. Deterministic for a given seed and thread count. Run with Debian's
interpreter (/usr/bin/python3); on 2 cores it takes about ten minutes.

    /usr/bin/python3 examples/fashion_mnist/train.py --out examples/fashion_mnist/fashion_mnist_cnn.onnx
    /usr/bin/python3 examples/fashion_mnist/train.py --arch mobilenet --epochs 10 \
        --out examples/fashion_mnist/fashion_mnist_mobilenet.onnx
    /usr/bin/python3 examples/fashion_mnist/train.py --arch recurrent --epochs 6 \
        --out examples/fashion_mnist/fashion_mnist_recurrent.onnx
"""
import argparse
import gzip
import os
import struct
import tempfile

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class FashionCNN(nn.Module):
    """Exercises the CNN ops of the core: plain, depthwise and pointwise Conv, BN (folded by the
    exporter), ReLU, MaxPool, a residual Add, AveragePool, Flatten, Gemm and Dropout."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.dw3 = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.bn3 = nn.BatchNorm2d(32)
        self.pw4 = nn.Conv2d(32, 64, 1)
        self.bn4 = nn.BatchNorm2d(64)
        self.conv5 = nn.Conv2d(64, 64, 3, padding=1)
        self.bn5 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 3 * 3, 128)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)      # 14x14
        x = F.relu(self.bn3(self.dw3(x)))
        x = F.max_pool2d(F.relu(self.bn4(self.pw4(x))), 2)        # 7x7
        x = F.relu(self.bn5(self.conv5(x)) + x)                   # residual
        x = F.avg_pool2d(x, 2)                                    # 3x3
        x = torch.flatten(x, 1)
        x = self.drop(F.relu(self.fc1(x)))
        return self.fc2(x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, ReLU6, residual when shapes match."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class FashionMobileNet(nn.Module):
    """A MobileNetV2-style network (depthwise separable inverted residuals, ReLU6 exported as Clip,
    global average pooling): the depthwise fixture for the accuracy tables."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 1, 2), InvertedResidual(16, 24, 2, 4), InvertedResidual(24, 24, 1, 4),
            InvertedResidual(24, 32, 2, 4), InvertedResidual(32, 32, 1, 4), InvertedResidual(32, 64, 1, 4))
        self.head = nn.Sequential(nn.Conv2d(64, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU6())
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class FashionRecurrent(nn.Module):
    """A sequence classifier: the image read row by row (28 steps of 28 pixels) by a GRU, then a
    bidirectional LSTM over the GRU's outputs; the mean over time feeds a Linear head. The
    recurrent fixture for the accuracy tables (GRU and LSTM nodes, batch-first and time-first
    layouts through the exporter's Transposes)."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(28, 96, batch_first=True)
        self.lstm = nn.LSTM(96, 64, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        rows = x.squeeze(1)  # [N, 28 steps, 28 pixels]
        y, _ = self.gru(rows)
        y, _ = self.lstm(y)
        return self.fc(y.mean(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", choices=["cnn", "mobilenet", "recurrent"], default="cnn")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)

    xtr = torch.from_numpy(read_idx(f"{DATA}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    ytr = torch.from_numpy(read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64))
    xte = torch.from_numpy(read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    yte = torch.from_numpy(read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    xtr, xte = xtr.unsqueeze(1), xte.unsqueeze(1)

    model = {"cnn": FashionCNN, "mobilenet": FashionMobileNet, "recurrent": FashionRecurrent}[args.arch]()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    steps_per_epoch = (len(xtr) + 127) // 128
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.epochs * steps_per_epoch)

    def evaluate():
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(xte[i:i + 1000]).argmax(1) for i in range(0, len(xte), 1000)])
        return (pred == yte).float().mean().item()

    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 128):
            idx = perm[i:i + 128]
            x = xtr[idx]
            # light augmentation: random horizontal flip (clothes are left/right symmetric)
            flip = torch.rand(len(idx)) < 0.5
            x[flip] = x[flip].flip(-1)
            loss = F.cross_entropy(model(x), ytr[idx], label_smoothing=0.05)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        print(f"epoch {epoch + 1}: loss {loss.item():.4f} test accuracy {evaluate() * 100:.2f}%", flush=True)

    model.eval()
    acc = evaluate()
    print(f"final test accuracy {acc * 100:.2f}%")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=out_dir)
    os.close(fd)
    torch.onnx.export(model, torch.zeros(1, 1, 28, 28), tmp, opset_version=13,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    m = onnx.load(tmp)
    onnx.checker.check_model(m)
    m.doc_string = (f"Fashion-MNIST {args.arch}, test accuracy {acc * 100:.2f}% "
                    f"(examples/fashion_mnist/train.py --arch {args.arch}, seed {args.seed})")
    onnx.save(m, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
