#!/usr/bin/env python3
"""Train the bundled text recognizer and export it as ONNX (opset 11, dynamic batch and width).

A CRNN-style model: four Conv+BN+ReLU blocks take a [N, 1, 32, W] line to a sequence of W/4
feature vectors, one transformer encoder block (LayerNorm, 4-head self-attention written out as
MatMul/Softmax, a GELU feed-forward, residual Adds) mixes them, and a linear head gives
log-probabilities over 36 characters and the CTC blank, [N, W/4, 37]. Trained with CTC on lines
rendered on the fly by lines.py. Deterministic for a seed and thread count; about ten minutes
on 2 cores.

    /usr/bin/python3 examples/ocr/train.py --out examples/ocr/text_recognizer.onnx
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lines

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
        a = torch.softmax(torch.matmul(q, k.transpose(2, 3)) / d ** 0.5, dim=-1)
        y = torch.matmul(a, v).transpose(1, 2).reshape(n, t, c)
        return self.out(y)


class Recognizer(nn.Module):
    def __init__(self, dim=128):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

        self.b1, self.b2, self.b3, self.b4 = block(1, 32), block(32, 64), block(64, 96), block(96, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, 4)
        self.ff1, self.ff2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, BLANK + 1)

    def forward(self, x):
        x = F.max_pool2d(self.b1(x), 2)                 # 16 x W/2
        x = F.max_pool2d(self.b2(x), 2)                 # 8 x W/4
        x = F.max_pool2d(self.b3(x), (2, 1))            # 4 x W/4
        x = self.b4(x).mean(dim=2)                      # [N, C, W/4]
        x = x.transpose(1, 2)                           # [N, T, C]
        x = x + self.attn(self.ln1(x))
        x = x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
        return F.log_softmax(self.head(x), dim=-1)      # [N, T, 37]


def batch(rng, size):
    texts = [lines.random_text(rng) for _ in range(size)]
    imgs = [lines.render(t, rng) for t in texts]
    w = max(i.shape[2] for i in imgs)
    x = np.stack([np.pad(i, ((0, 0), (0, 0), (0, w - i.shape[2]))) for i in imgs])
    targets = torch.tensor([lines.CHARSET.index(ch) for t in texts for ch in t], dtype=torch.long)
    return torch.from_numpy(x), targets, torch.tensor([len(t) for t in texts]), texts


def decode(logp):  # [T, 37] -> text, greedy CTC
    best = logp.argmax(-1).tolist()
    out, prev = [], BLANK
    for b in best:
        if b != prev and b != BLANK:
            out.append(lines.CHARSET[b])
        prev = b
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed + 100)
    model = Recognizer()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=a.steps, pct_start=0.1)
    ctc = nn.CTCLoss(blank=BLANK, zero_infinity=True)
    start = time.time()
    for step in range(a.steps):
        model.train()
        x, targets, lengths, _ = batch(rng, 32)
        logp = model(x)                                  # [N, T, C]
        t = torch.full((x.shape[0],), logp.shape[1], dtype=torch.long)
        loss = ctc(logp.transpose(0, 1), targets, t, lengths)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == a.steps - 1:
            model.eval()
            with torch.no_grad():
                vrng = np.random.default_rng(999)
                x, _, _, texts = batch(vrng, 128)
                logp = model(x)
                acc = np.mean([decode(logp[i]) == texts[i] for i in range(len(texts))])
            print("step %d loss %.4f exact-match %.3f (%.0f s)" % (step, loss.item(), acc, time.time() - start),
                  flush=True)
        if time.time() - start > a.minutes * 60:
            print("time budget reached at step %d" % step)
            break
    model.eval()
    example = torch.from_numpy(lines.render("EXPORT123", np.random.default_rng(1))[None])
    torch.onnx.export(model, example, a.out, opset_version=11, input_names=["line"], output_names=["log_probs"],
                      dynamic_axes={"line": {0: "N", 3: "W"}, "log_probs": {0: "N", 1: "T"}})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
