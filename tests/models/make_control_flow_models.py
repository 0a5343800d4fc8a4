#!/usr/bin/env python3
"""Writes a model with data-dependent control flow, as torch.onnx exports a scripted module, in
the layout of make_models.py (NAME/model.onnx, NAME/calib, NAME/eval, NAME/input_name):

- if_loop_net: a convolution, then an If on the mean activation (a 3x3 convolution in one branch,
  a 1x1 in the other; both read their weights from the enclosing graph), then a Loop whose trip
  count is the input height / 8 (a residual refinement convolution per iteration, the
  loop-carried feature map), then a convolution head; torch.jit.script, opset 13, dynamic batch
  and size.
- strip_list_net: a convolution per horizontal strip of the feature map, one strip per loop step,
  appended to a list and concatenated (torch.onnx writes SequenceEmpty, SequenceInsert in a Loop
  that carries the sequence, ConcatFromSequence); opset 13.
- vad_like: shaped like a published voice-activity detector (opset 16): inputs `input` [batch,
  samples], `sr` (int64, 0-d), LSTM states `h`, `c` [2, batch, 64]; the whole network sits in the
  two branches of an If on sr == 16000 (per rate: a fixed Fourier-basis Conv1d and its magnitude,
  a convolutional encoder, a two-layer LSTM carrying the states, a Conv1d decoder). Calibrated on
  chunks of a synthetic recording at both rates with the states the float model carries from
  chunk to chunk; several inputs, so it uses the ONNX test-data layout (calib/test_data_set_*,
  eval/test_data_set_*) plus eval_npy/<input>.npy for ONNX Runtime.
- vad_nested: vad_like with its network four Ifs deep (the rate, then the chunk size, the state's
  magnitude and the batch, as the published detector nests them around its LSTM), and the inputs
  and outputs of every body left untyped, as that detector's exporter leaves them (torch 1.13
  types them; they are cleared after export).
- loop_nested: the same network four levels deep with Loops and Ifs alternating (a Loop over the
  chunk's halves, an If on the rate, a Loop of two refinement steps carrying the LSTM states, an
  If on the state's magnitude), body values typed as torch writes them (ONNX Runtime needs the
  shapes of a Loop body's iteration number and condition).

Calibration images are of three brightness levels and several sizes, so that both branches run
(each is quantized inside its body) and the loop runs 2 to 4 times; the evaluation batch has a
size none of them has and takes the 3x3 branch.

    /usr/bin/python3 tests/models/make_control_flow_models.py OUT_DIR
"""
import os
import sys
from typing import List

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import numpy_helper

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
        if bool(f.mean() > 0.065):
            f = torch.relu(self.wide(f))
        else:
            f = torch.relu(self.narrow(f)) * 2.0
        for _ in range(x.shape[2] // 8):
            f = f + 0.5 * torch.relu(self.refine(f))
        return self.head(f)


class StripListNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.strip = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        f = torch.relu(self.stem(x))
        parts: List[torch.Tensor] = []
        for i in range(f.shape[2] // 4):
            parts.append(torch.relu(self.strip(f[:, :, i * 4:(i + 1) * 4])))
        return self.head(torch.cat(parts, 2))


def make_strip_list_net(out):
    torch.manual_seed(2)
    folder = os.path.join(out, "strip_list_net")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    torch.onnx.export(torch.jit.script(StripListNet().eval()), torch.rand(1, 3, 16, 16), path, opset_version=13,
                      input_names=["image"], output_names=["y"],
                      dynamic_axes={"image": {0: "batch", 2: "h", 3: "w"}, "y": {0: "batch", 2: "h", 3: "w"}})
    rng = np.random.default_rng(7)
    calib = [rng.random((2, 3, s, s), dtype=np.float32) for s in (16, 24, 32) for _ in range(2)]
    write_layout(folder, calib, rng.random((2, 3, 20, 20), dtype=np.float32), "image")
    print(f"strip_list_net: {path}")


class RateBranch(nn.Module):
    """One sample rate's network: |Fourier basis conv|, encoder, 2-layer LSTM, decoder."""

    def __init__(self, window):
        super().__init__()
        bins = window // 2 + 1
        t = torch.arange(window, dtype=torch.float32)
        k = torch.arange(bins, dtype=torch.float32).unsqueeze(1)
        hann = 0.5 - 0.5 * torch.cos(2 * np.pi * t / window)
        basis = torch.cat([torch.cos(2 * np.pi * k * t / window), -torch.sin(2 * np.pi * k * t / window)]) * hann
        self.bins = bins
        self.stft = nn.Conv1d(1, 2 * bins, window, stride=window // 2, bias=False)
        self.stft.weight.data.copy_(basis.unsqueeze(1))
        self.encoder = nn.Sequential(nn.Conv1d(bins, 32, 3, padding=1), nn.ReLU(),
                                     nn.Conv1d(32, 64, 3, stride=2, padding=1), nn.ReLU())
        self.lstm = nn.LSTM(64, 64, num_layers=2, batch_first=True)
        self.decoder = nn.Conv1d(64, 1, 1)

    def forward(self, x, h, c):
        spec = self.stft(x.unsqueeze(1))
        re, im = spec[:, :self.bins], spec[:, self.bins:]
        f = self.encoder(torch.sqrt(re * re + im * im + 1e-9))
        y, (h2, c2) = self.lstm(f.transpose(1, 2), (h, c))
        out = torch.sigmoid(self.decoder(torch.relu(y.transpose(1, 2)))).mean(2)
        return out, h2, c2


class VadLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.at16k = RateBranch(64)
        self.at8k = RateBranch(32)

    def forward(self, x, sr, h, c):
        if bool(sr == 16000):
            out, h2, c2 = self.at16k(x, h, c)
        else:
            out, h2, c2 = self.at8k(x, h, c)
        return out, h2, c2


class Nested(nn.Module):
    """A RateBranch three Ifs deep; the conditions hold on real chunks, the else branches scale."""

    def __init__(self, window):
        super().__init__()
        self.branch = RateBranch(window)

    def forward(self, x, h, c):
        if bool(x.size(1) >= 128):
            if bool(h.abs().sum() < 1e6):
                if bool(x.size(0) >= 1):
                    out, h2, c2 = self.branch(x, h, c)
                else:
                    out, h2, c2 = self.branch(x * 0.5, h, c)
            else:
                out, h2, c2 = self.branch(x, h * 0.5, c)
        else:
            out, h2, c2 = self.branch(x * 2.0, h, c)
        return out, h2, c2


class VadNested(nn.Module):
    def __init__(self):
        super().__init__()
        self.at16k = Nested(64)
        self.at8k = Nested(32)

    def forward(self, x, sr, h, c):
        if bool(sr == 16000):
            out, h2, c2 = self.at16k(x, h, c)
        else:
            out, h2, c2 = self.at8k(x, h, c)
        return out, h2, c2


class LoopNested(nn.Module):
    """The network four control-flow levels deep, Loops and Ifs alternating: a Loop over the two
    halves of the chunk, an If on the rate, a Loop of sr / 8000 refinement steps carrying the LSTM
    states, an If on the state's magnitude; inside, the convolutional encoder and the LSTM."""

    def __init__(self):
        super().__init__()
        self.at16k = RateBranch(64)
        self.at8k = RateBranch(32)

    def forward(self, x, sr, h, c):
        half = x.size(1) // 2
        total = torch.zeros(x.size(0), 1)
        for i in range(x.size(1) // half):  # trip counts from the data: exported as Loops
            part = x[:, i * half:(i + 1) * half]
            if bool(sr == 16000):
                out = torch.zeros(x.size(0), 1)
                for _ in range(int(sr) // 8000):
                    if bool(h.abs().sum() < 1e6):
                        out, h, c = self.at16k(part, h, c)
                    else:
                        out, h, c = self.at16k(part, h * 0.5, c)
            else:
                out, h, c = self.at8k(part, h, c)
            total = total + 0.5 * out
        return total, h, c


def untype_bodies(path):
    """Clears the types of every body input and output, as some exporters write them."""
    m = onnx.load(path)

    def walk(g):
        for n in g.node:
            for a in n.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    for v in list(sub.input) + list(sub.output):
                        v.ClearField("type")
                    walk(sub)

    walk(m.graph)
    del m.graph.value_info[:]
    onnx.save(m, path)


def write_records(folder, records):
    for k, arrays in enumerate(records):
        d = os.path.join(folder, f"test_data_set_{k}")
        os.makedirs(d, exist_ok=True)
        for i, a in enumerate(arrays):
            with open(os.path.join(d, f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(a).SerializeToString())


def make_vad_like(out, name="vad_like", cls=VadLike):
    torch.manual_seed(1)
    model = cls().eval()
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    zeros = torch.zeros(2, 1, 64)
    torch.onnx.export(torch.jit.script(model), (torch.rand(1, 512), torch.tensor(16000), zeros, zeros), path,
                      opset_version=16, input_names=["input", "sr", "h", "c"], output_names=["output", "hn", "cn"],
                      dynamic_axes={"input": {0: "batch", 1: "samples"}, "h": {1: "batch"}, "c": {1: "batch"}})
    if name == "vad_nested":
        untype_bodies(path)
    # A synthetic recording: noise with voiced bursts (harmonics of a gliding pitch).
    rng = np.random.default_rng(4)
    t = np.arange(16000 * 2) / 16000
    voiced = (np.sin(2 * np.pi * 3 * t) > 0.2).astype(np.float32)
    pitch = 2 * np.pi * np.cumsum(140 + 40 * np.sin(2 * np.pi * 0.7 * t)) / 16000
    audio = 0.05 * rng.standard_normal(t.size) + voiced * sum(0.3 / k * np.sin(k * pitch) for k in (1, 2, 3))
    records = []
    for sr, chunk in ((16000, 512), (8000, 256)):
        signal = audio if sr == 16000 else audio[::2]
        h = c = torch.zeros(2, 1, 64)
        for start in range(0, 16 * chunk, chunk):
            x = torch.tensor(signal[start:start + chunk], dtype=torch.float32).unsqueeze(0)
            records.append([x.numpy(), np.array(sr, dtype=np.int64), h.numpy(), c.numpy()])
            with torch.no_grad():
                _, h, c = model(x, torch.tensor(sr), h, c)
    write_records(os.path.join(folder, "calib"), records[::2] + records[1::2])  # the rates alternate
    # Evaluation: a later 16 kHz chunk with its carried state, then four copies perturbed by 1e-6.
    x, sr, h, c = records[9]
    evaluation = [[x, sr, h, c]]
    for seed in range(2, 6):
        noise = np.random.default_rng(seed)
        evaluation.append([a * (1 + noise.standard_normal(a.shape).astype(np.float32) * np.float32(1e-6))
                           if a.dtype == np.float32 else a for a in (x, sr, h, c)])
    write_records(os.path.join(folder, "eval"), evaluation)
    os.makedirs(os.path.join(folder, "eval_npy"), exist_ok=True)
    for input_name, a in zip(("input", "sr", "h", "c"), (x, sr, h, c)):
        np.save(os.path.join(folder, "eval_npy", f"{input_name}.npy"), a)
    with open(os.path.join(folder, "input_name"), "w") as f:
        f.write("input")
    print(f"{name}: {path}")


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
    # Sizes alternate, so that no two neighbours share a batch: each image picks its own branch
    # (the stem's mean activation is about 0.05 at levels 0.2 and 1, 0.08 at level 2).
    calib = [(rng.random((1, 3, s, s), dtype=np.float32) * level).astype(np.float32)
             for level in (0.2, 1.0, 2.0) for s in (16, 24, 32)]
    write_layout(folder, calib, rng.random((2, 3, 20, 20), dtype=np.float32) * np.float32(2.5), "image")
    print(f"if_loop_net: {path}")
    make_strip_list_net(out)
    make_vad_like(out)
    make_vad_like(out, "vad_nested", VadNested)
    make_vad_like(out, "loop_nested", LoopNested)


if __name__ == "__main__":
    main()
