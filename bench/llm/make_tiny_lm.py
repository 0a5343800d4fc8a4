#!/usr/bin/env python3
"""Trains a small byte-level decoder-only transformer on CPU and exports it to ONNX.

    make_tiny_lm.py OUT_DIR [--steps N] [--small] [--shape D,LAYERS,HEADS,FF] [--arch gpt|llama]
                    [--gpt2] [--ctx N] [--opset N] [--calib N] [--dynamic-length]

--gpt2 is nanoGPT's layout at a small size, as a user's torch 1.13 / opset 14 export gives it:
d 128, 4 heads, 4 pre-LayerNorm blocks with a fused qkv Linear with bias and a GELU MLP of 4d,
learned positions, an untied head, 64-byte windows, 64 calibration windows.

The corpus is the licence texts every Debian system has (/usr/share/common-licenses, from
base-files): the last tenth of each text is held out. Writes OUT_DIR/model.onnx (input "tokens"
int64 [batch, CTX], output "logits" [batch, CTX, 256]), calib/ (32 training windows, one .npy
each), eval/ (every held-out window, one .npy each) and info.json (sizes, training loss, time).
--dynamic-length exports the window length as a dynamic axis (up to CTX): positions and the
causal mask are sliced to the input's length, so a decode can run only the tokens it has.
The attention is written out as MatMul / Softmax (no fused kernel) and every Linear of the
blocks and the head is a MatMul on a constant weight, as larger exported decoders are.
"""
import argparse
import json
import os
import time

import numpy as np
import torch
from torch import nn

CTX = 128
DYNAMIC = False  # --dynamic-length


def causal(mask, t):
    return mask[:t, :t] if DYNAMIC else mask


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.register_buffer("mask", torch.full((CTX, CTX), float("-inf")).triu(1))

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(2, 3) * (d // h) ** -0.5 + causal(self.mask, t), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        # The root mean square from the L2 norm (one ReduceL2, whose sum of squares runtimes widen):
        # x.pow(2) in a float16 run overflows wherever |x| > 256, as a trained decoder's residual
        # stream reaches.
        rms = torch.norm(x, p=2, dim=-1, keepdim=True) * x.shape[-1] ** -0.5
        return x / (rms + self.eps) * self.weight


class LlamaBlock(nn.Module):
    """Llama's layout: RMSNorm, separate bias-free q/k/v/o projections, a SwiGLU MLP
    (down(SiLU(gate(x)) * up(x))). Positions come from the model's learnt table, not rotary
    embeddings: the weights' shapes and the graph around them are what quantization sees."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)
        self.register_buffer("mask", torch.full((CTX, CTX), float("-inf")).triu(1))

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        n = self.ln1(x)
        q, k, v = (p(n).reshape(b, t, h, d // h).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(2, 3) * (d // h) ** -0.5 + causal(self.mask, t), dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        n = self.ln2(x)
        return x + self.down(nn.functional.silu(self.gate(n)) * self.up(n))


class TinyLM(nn.Module):
    def __init__(self, d, layers, heads, ff, llama=False):
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(CTX, d) * 0.02)
        self.blocks = nn.ModuleList((LlamaBlock if llama else Block)(d, heads, ff) for _ in range(layers))
        self.ln = RMSNorm(d) if llama else nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + (self.pos[: tokens.shape[1]] if DYNAMIC else self.pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def corpus():
    root = "/usr/share/common-licenses"
    seen, train, held = set(), [], []
    for name in sorted(os.listdir(root)):
        path = os.path.realpath(os.path.join(root, name))
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
        cut = len(data) * 9 // 10
        train.append(data[:cut])
        held.append(data[cut:])
    return np.concatenate(train).astype(np.int64), np.concatenate(held).astype(np.int64)


def main():
    global CTX, DYNAMIC
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--small", action="store_true", help="a smaller model and fewer steps (CI)")
    ap.add_argument("--shape", help="d_model,layers,heads,ff of a larger model (timing runs)")
    ap.add_argument("--arch", choices=["gpt", "llama"], default="gpt",
                    help="gpt: LayerNorm, fused qkv, GELU MLP with biases; llama: RMSNorm, SwiGLU, no biases")
    ap.add_argument("--gpt2", action="store_true",
                    help="nanoGPT's shape: d 128, 4 layers, 4 heads, ff 512, ctx 64, opset 14, 64 calibration windows")
    ap.add_argument("--ctx", type=int, help="window length in bytes (128; 64 with --gpt2)")
    ap.add_argument("--opset", type=int, help="ONNX opset of the export (17; 14 with --gpt2)")
    ap.add_argument("--calib", type=int, help="calibration windows (32; 64 with --gpt2)")
    ap.add_argument("--device", default="cpu", help="where to train (cpu, cuda); the export is made on the CPU")
    ap.add_argument("--dynamic-length", action="store_true",
                    help="the window length a dynamic axis of the export (decoding runs)")
    a = ap.parse_args()
    DYNAMIC = a.dynamic_length
    if a.gpt2:
        a.shape = a.shape or "128,4,4,512"
    CTX = a.ctx or (64 if a.gpt2 else 128)
    opset = a.opset or (14 if a.gpt2 else 17)
    calib = a.calib or (64 if a.gpt2 else 32)
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    d, layers, heads, ff = (64, 2, 4, 256) if a.small else (192, 4, 6, 768)
    if a.shape:
        d, layers, heads, ff = map(int, a.shape.split(","))
    steps = min(a.steps, 150) if a.small else a.steps
    train, held = corpus()
    model = TinyLM(d, layers, heads, ff, llama=a.arch == "llama").to(a.device)
    if steps > 0:  # --steps 0: the random initial weights (timing and memory runs)
        # 3e-3 up to width 256, then inversely with the width (3.75e-4 at 2048, as 1 B decoders
        # train): at 3e-3 a 1 B decoder's activations grow past float16's largest value.
        lr = 3e-3 * min(1.0, 256 / d)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(1)
    start, loss = time.time(), None
    for step in range(steps):
        at = torch.randint(0, len(train) - CTX - 1, (32,), generator=gen)
        x = torch.stack([torch.from_numpy(train[i:i + CTX + 1]) for i in at.tolist()])
        x = x.to(a.device)
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    model = model.cpu().eval()
    os.makedirs(os.path.join(a.out, "calib"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "eval"), exist_ok=True)
    with torch.no_grad():
        # PyTorch 2.x defaults to its dynamo exporter; the TorchScript one writes what 1.13 writes.
        legacy = {"dynamo": False} if int(torch.__version__.split(".")[0]) >= 2 else {}
        torch.onnx.export(model, torch.zeros(1, CTX, dtype=torch.int64), os.path.join(a.out, "model.onnx"),
                          opset_version=opset, input_names=["tokens"], output_names=["logits"],
                          dynamic_axes={"tokens": {0: "batch", 1: "length"} if DYNAMIC else {0: "batch"},
                                        "logits": {0: "batch", 1: "length"} if DYNAMIC else {0: "batch"}},
                          **legacy)
    rng = np.random.default_rng(2)
    for i, s in enumerate(rng.integers(0, len(train) - CTX, calib)):
        np.save(os.path.join(a.out, "calib", f"{i:03d}.npy"), train[s:s + CTX])
    windows = len(held) // CTX
    for i in range(windows):
        np.save(os.path.join(a.out, "eval", f"{i:04d}.npy"), held[i * CTX:(i + 1) * CTX])
    info = {"d_model": d, "layers": layers, "heads": heads, "ff": ff,
            "parameters": sum(p.numel() for p in model.parameters()), "train_bytes": int(len(train)),
            "eval_windows": windows, "steps": steps, "arch": a.arch, "ctx": CTX, "opset": opset,
            "final_train_loss": None if loss is None else float(loss), "seconds": time.time() - start}
    json.dump(info, open(os.path.join(a.out, "info.json"), "w"), indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
