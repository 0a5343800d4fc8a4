#!/usr/bin/env python3
"""Writes recurrent test models as torch.onnx exports them, with calibration/evaluation samples in
the layout of make_models.py (NAME/model.onnx, NAME/calib, NAME/eval, NAME/input_name):

- lstm_classifier: a sequence classifier over feature frames (speech-style input, [batch, time,
  40]): two stacked bidirectional LSTM layers (batch_first), mean over time, a Linear head;
  opset 11, dynamic batch and time.
- gru_classifier: the same with a two-layer unidirectional GRU followed by a reverse-direction
  read-out of its last frame; opset 14.
- crnn_ctc: the classic CRNN text recognizer (CNN over a 32-pixel line, height collapsed, a
  bidirectional LSTM over the width, per-frame LogSoftmax for CTC, batch first as PaddleOCR's
  recognizers give it); opset 11, dynamic batch and
  width.

Weights are random but scaled as trained ones are (PyTorch's default init); calibration samples
differ in length (time steps or width), one per .npy file; the evaluation batch has a length no
calibration sample has.

    /usr/bin/python3 tests/models/make_recurrent_models.py OUT_DIR [NAME ...]
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

from fixture_layout import write_layout

ALL = ["lstm_classifier", "gru_classifier", "crnn_ctc"]


class LstmClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(40, 48, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(96, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y.mean(1))


class GruClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(40, 64, num_layers=2)
        self.head = nn.Linear(64, 10)

    def forward(self, x):  # x: [batch, time, 40]
        y, h = self.gru(x.transpose(0, 1))
        return self.head(torch.relu(h[-1]) + y.flip(0)[0])


class Crnn(nn.Module):
    def __init__(self, classes=37):
        super().__init__()
        def block(i, o, pool):
            return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(pool)]
        self.cnn = nn.Sequential(*block(1, 16, 2), *block(16, 32, 2), *block(32, 64, (2, 1)), *block(64, 64, (4, 1)))
        self.rnn = nn.LSTM(64, 48, bidirectional=True)
        self.head = nn.Linear(96, classes)

    def forward(self, x):  # x: [batch, 1, 32, width]
        f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # [width / 4, batch, 64]
        y, _ = self.rnn(f)
        return torch.log_softmax(self.head(y.transpose(0, 1)), -1)  # [batch, width / 4, classes]


def export(name, out):
    torch.manual_seed(ALL.index(name))
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(7 + ALL.index(name))
    if name == "crnn_ctc":
        model, opset, axes = Crnn(), 11, {0: "batch", 3: "width"}
        make = lambda n, length: rng.random((n, 1, 32, length), dtype=np.float32)
        lengths, eval_length = (48, 64, 80, 96, 48, 64, 80, 96), 112
        with torch.no_grad():  # BatchNorm statistics as training leaves them
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(0, 0.5)
                    m.running_var.uniform_(0.2, 1)
    else:
        model = LstmClassifier() if name == "lstm_classifier" else GruClassifier()
        opset, axes = (11 if name == "lstm_classifier" else 14), {0: "batch", 1: "time"}
        make = lambda n, length: rng.standard_normal((n, length, 40)).astype(np.float32)
        lengths, eval_length = (20, 30, 40, 50, 20, 30, 40, 50), 36
    model.eval()
    path = os.path.join(folder, "model.onnx")
    torch.onnx.export(model, torch.from_numpy(make(1, lengths[0])), path, opset_version=opset, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": axes})
    write_layout(folder, [make(1, n) for n in lengths], make(2, eval_length), "x")
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
