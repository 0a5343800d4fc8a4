#!/usr/bin/env python3
"""Train the classic CRNN text recognizer and export it as ONNX (opset 11, dynamic batch and width).

The architecture of the older OCR recognizers still deployed everywhere (CRNN; PaddleOCR's
rec_crnn / "CRNN + CTC" configs): a VGG-style CNN (3x3 convolutions, BatchNorm, ReLU, max pooling
that halves the height faster than the width) takes a [N, 1, 32, W] line to W/4 feature columns,
two stacked bidirectional LSTM layers read them, and a linear CTC head gives probabilities over
the 62 characters and the blank, [N, W/4, 63]. Trained with CTC on lines rendered by lines.py,
the same data and decoding as train.py's recognizer.

    /usr/bin/python3 examples/ocr/train_crnn.py --out examples/ocr/crnn_recognizer.onnx [--device cuda]

The bundled model (0.82 M parameters, 3.3 MB) was trained on one GPU with --device cuda --workers 12
--steps 12000 (12,000 steps of 128 lines in 168 s; exact-match 0.918 on the 256 lines it
evaluates on); --save
STATE.npz keeps the weights and --export-from STATE.npz exports them with this file's torch.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lines
from ocr_blocks import parse_args, train_or_load
from train import BLANK, ctc_loss, exact_match, make_batch


class Crnn(nn.Module):
    def __init__(self, hidden=96):
        super().__init__()

        def conv(i, o):
            return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]

        self.cnn = nn.Sequential(
            *conv(1, 32), nn.MaxPool2d(2),                 # 16 x W/2
            *conv(32, 64), nn.MaxPool2d(2),                # 8 x W/4
            *conv(64, 96), *conv(96, 96), nn.MaxPool2d((2, 1)),  # 4
            *conv(96, 128), nn.MaxPool2d((2, 1)),          # 2
            *conv(128, 128), nn.MaxPool2d((2, 1)))         # 1 x W/4
        self.rnn = nn.LSTM(128, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, BLANK + 1)

    def forward(self, x):
        f = self.cnn(x).squeeze(2).transpose(1, 2)  # [N, W/4, C]
        y, _ = self.rnn(f)
        logits = self.head(y)
        return F.log_softmax(logits, dim=-1) if self.training else F.softmax(logits, dim=-1)  # [N, T, 63]


def main():
    a = parse_args(__doc__, steps=6000, lr=1e-3)
    model = train_or_load(Crnn(), make_batch, ctc_loss, exact_match, a)
    if not a.out:
        return
    example = torch.from_numpy(lines.render("EXPORT123", np.random.default_rng(1))[None])
    torch.onnx.export(model, example, a.out, opset_version=11, input_names=["line"], output_names=["probs"],
                      dynamic_axes={"line": {0: "N", 3: "W"}, "probs": {0: "N", 1: "T"}})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
