"""Building blocks shared by the OCR fixtures, after the mobile backbones deployed OCR models
use (PP-LCNet / MobileNetV3: depthwise-separable convolutions, hard-swish, squeeze-excitation)
and the training loop both fixtures share (one process, data rendered by worker processes).
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBNAct(nn.Sequential):
    def __init__(self, cin, cout, k=3, stride=1, groups=1, act=nn.Hardswish):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(s))))


class DepthwiseSeparable(nn.Module):
    """PP-LCNet's block: 3x3 depthwise, optional squeeze-excitation, 1x1 pointwise."""

    def __init__(self, cin, cout, stride=1, se=False):
        super().__init__()
        self.dw = ConvBNAct(cin, cin, 3, stride, groups=cin)
        self.se = SqueezeExcite(cin) if se else nn.Identity()
        self.pw = ConvBNAct(cin, cout, 1)

    def forward(self, x):
        return self.pw(self.se(self.dw(x)))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expansion, kxk depthwise, optional squeeze-excitation, linear
    1x1 projection, and a residual Add when the shape allows."""

    def __init__(self, cin, expand, cout, k, stride, se, act):
        super().__init__()
        self.expand = ConvBNAct(cin, expand, 1, act=act) if expand != cin else nn.Identity()
        self.dw = ConvBNAct(expand, expand, k, stride, groups=expand, act=act)
        self.se = SqueezeExcite(expand) if se else nn.Identity()
        self.project = ConvBNAct(expand, cout, 1, act=None)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class Batches(torch.utils.data.IterableDataset):
    """An endless stream of batches from make(rng), each worker with its own seed."""

    def __init__(self, make, seed):
        super().__init__()
        self.make, self.seed = make, seed

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        rng = np.random.default_rng([self.seed, info.id if info else 0])
        while True:
            yield self.make(rng)


def save_state(model, path):
    np.savez(path, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


def load_state(model, path):
    state = np.load(path)
    model.load_state_dict({k: torch.from_numpy(state[k]) for k in state.files})


def train(model, make_batch, loss_fn, evaluate, a):
    """AdamW with a one-cycle schedule over a.steps batches (or a.minutes), evaluating every
    a.every steps; a.device is "cpu" or "cuda"."""
    dev = torch.device(a.device)
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps, pct_start=0.05)
    prefetch = {"prefetch_factor": 8} if a.workers else {}  # only valid with worker processes
    loader = torch.utils.data.DataLoader(Batches(make_batch, a.seed), batch_size=None, num_workers=a.workers,
                                         **prefetch)
    start = time.time()
    for step, b in enumerate(loader):
        model.train()
        loss = loss_fn(model, [t.to(dev, non_blocking=True) if torch.is_tensor(t) else t for t in b])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        last = step == a.steps - 1 or time.time() - start > a.minutes * 60
        if step % a.every == 0 or last:
            model.eval()
            with torch.no_grad():
                score = evaluate(model, dev)
            print("step %d loss %.4f %s (%.0f s)" % (step, loss.item(), score, time.time() - start), flush=True)
        if last:
            break
    model.cpu().eval()


def parse_args(doc, steps, lr):
    """The options both training scripts take; seeds torch with --seed before the model is built."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the ONNX file to write")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--save", help="also write the trained weights here (.npz)")
    ap.add_argument("--export-from", help="skip training: export these weights (.npz)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    return a


def train_or_load(model, make_batch, loss_fn, evaluate, a):
    """Trains `model` (saving the weights with --save), or loads --export-from and evaluates it."""
    if a.export_from:
        load_state(model, a.export_from)
        model.eval()
        print(evaluate(model, torch.device("cpu")))
    else:
        train(model, make_batch, loss_fn, evaluate, a)
        if a.save:
            save_state(model, a.save)
    return model
