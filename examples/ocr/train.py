#!/usr/bin/env python3
"""Train the bundled text recognizer and export it as ONNX (opset 11, dynamic batch and width).

Shaped like the mobile recognizers people deploy (PP-OCRv3's SVTR-LCNet): a PP-LCNet backbone
(depthwise-separable convolutions, hard-swish, squeeze-excitation) takes a [N, 1, 32, W] line to
W/4 feature columns; an SVTR neck (3x3 and 1x1 convolutions down to 120 channels, two pre-norm
transformer blocks with 8-head self-attention written out as MatMul/Softmax and a Swish MLP, a
final LayerNorm, a 1x1 convolution back up, Concat with the backbone's features, 3x3 and 1x1
convolutions) mixes them; a linear CTC head gives probabilities over 62 characters and the
blank, [N, W/4, 63] (log-probabilities while training). Trained with CTC on lines rendered on
the fly by lines.py.

    /usr/bin/python3 examples/ocr/train.py --out examples/ocr/text_recognizer.onnx [--device cuda]

The bundled model was trained on one GPU with --device cuda --workers 8 --steps 20000
--minutes 7.5 (the time limit stopped it at step 15,055; 128 lines a step); --save STATE.npz keeps the weights and --export-from STATE.npz exports them (opset 11)
with this file's torch.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lines
from ocr_blocks import ConvBNAct, DepthwiseSeparable, parse_args, train_or_load

BLANK = len(lines.CHARSET)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):  # [N, T, C]
        n, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.reshape(n, t, self.heads, d).transpose(1, 2)
        k = k.reshape(n, t, self.heads, d).transpose(1, 2)
        v = v.reshape(n, t, self.heads, d).transpose(1, 2)
        a = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * d ** -0.5, dim=-1)
        y = torch.matmul(a, v).transpose(1, 2).reshape(n, t, c)
        return self.out(y)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.silu(self.fc1(self.ln2(x))))


class Recognizer(nn.Module):
    def __init__(self, width=192, dim=120):
        super().__init__()
        self.backbone = nn.Sequential(
            ConvBNAct(1, 16, 3, 2),                                         # 16 x W/2
            DepthwiseSeparable(16, 32), DepthwiseSeparable(32, 64, (2, 2)),  # 8 x W/4
            DepthwiseSeparable(64, 64), DepthwiseSeparable(64, 128, (2, 1)),  # 4
            DepthwiseSeparable(128, 128), DepthwiseSeparable(128, 128, se=True),
            DepthwiseSeparable(128, width, (2, 1), se=True),                 # 2
            DepthwiseSeparable(width, width, se=True))
        self.down = nn.Sequential(ConvBNAct(width, width // 8, 3, act=nn.SiLU),
                                  ConvBNAct(width // 8, dim, 1, act=nn.SiLU))
        self.blocks = nn.ModuleList([Block(dim, 8), Block(dim, 8)])
        self.norm = nn.LayerNorm(dim)
        self.up = ConvBNAct(dim, width, 1, act=nn.SiLU)
        self.fuse = nn.Sequential(ConvBNAct(2 * width, width // 8, 3, act=nn.SiLU),
                                  ConvBNAct(width // 8, dim, 1, act=nn.SiLU))
        self.head = nn.Linear(dim, BLANK + 1)

    def forward(self, x):
        f = F.avg_pool2d(self.backbone(x), (2, 1))      # [N, C, 1, T]
        z = self.down(f)
        n, c, _, t = z.shape
        z = z.reshape(n, c, t).transpose(1, 2)          # [N, T, C]
        for b in self.blocks:
            z = b(z)
        z = self.norm(z).transpose(1, 2).reshape(n, c, 1, t)
        z = self.fuse(torch.cat([f, self.up(z)], 1))    # [N, C, 1, T]
        logits = self.head(z.reshape(n, z.shape[1], t).transpose(1, 2))
        # CTC trains on log-probabilities; the deployed model gives probabilities, as PaddleOCR's
        # CTC head does in inference.
        return F.log_softmax(logits, dim=-1) if self.training else F.softmax(logits, dim=-1)  # [N, T, 63]


def make_batch(rng, size=128):
    texts = [lines.random_text(rng) for _ in range(size)]
    imgs = [lines.render(t, rng) for t in texts]
    w = max(i.shape[2] for i in imgs)
    x = np.stack([np.pad(i, ((0, 0), (0, 0), (0, w - i.shape[2]))) for i in imgs])
    targets = torch.tensor([lines.CHARSET.index(ch) for t in texts for ch in t], dtype=torch.long)
    return torch.from_numpy(x), targets, torch.tensor([len(t) for t in texts])


def decode(best):  # greedy CTC
    out, prev = [], BLANK
    for b in best:
        if b != prev and b != BLANK:
            out.append(lines.CHARSET[b])
        prev = b
    return "".join(out)


def ctc_loss(model, b):
    x, targets, lengths = b
    logp = model(x)
    t = torch.full((x.shape[0],), logp.shape[1], dtype=torch.long)
    return F.ctc_loss(logp.transpose(0, 1), targets, t, lengths, blank=BLANK, zero_infinity=True)


def exact_match(model, dev):
    rng = np.random.default_rng(999)
    texts = [lines.random_text(rng) for _ in range(256)]
    x = torch.from_numpy(np.stack([lines.render(t, rng, 192) for t in texts])).to(dev)
    best = model(x).argmax(-1).cpu().tolist()
    return "exact-match %.3f" % np.mean([decode(best[i]) == texts[i] for i in range(len(texts))])


def main():
    a = parse_args(__doc__, steps=8000, lr=1e-3)
    model = train_or_load(Recognizer(), make_batch, ctc_loss, exact_match, a)
    if not a.out:
        return
    example = torch.from_numpy(lines.render("EXPORT123", np.random.default_rng(1))[None])
    torch.onnx.export(model, example, a.out, opset_version=11, input_names=["line"], output_names=["probs"],
                      dynamic_axes={"line": {0: "N", 3: "W"}, "probs": {0: "N", 1: "T"}})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
