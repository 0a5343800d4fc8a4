#!/usr/bin/env python3
"""Reference values for the observer tests, computed with numpy directly on the full data
(independently of Sparsebit's C++ code):

  data.npy         8192 float32 values (Laplace, scale 0.5, plus a few outliers), seed 0
  reference.json   per observer, the range [lo, hi] it should pick for 8-bit symmetric

    /usr/bin/python3 tests/observers/make_reference.py tests/observers
"""
import json
import math
import os
import sys

import numpy as np


def fake_quant_symmetric(x, lo, hi, bits=8):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(2 * max(-lo, hi) / (qmax - qmin), 1e-6)
    scale = np.float32(scale)
    q = np.clip(np.round(x.astype(np.float32) / scale), qmin, qmax)
    return (q * scale).astype(np.float64)


def percentile(x, alpha):
    xs = np.sort(x)
    n_neg, n_pos = int((x < 0).sum()), int((x >= 0).sum())
    lo = xs[max(round(n_neg * alpha), 1) - 1] if n_neg else 0.0
    hi = xs[len(x) - max(round(n_pos * alpha), 0) - 1] if n_pos else 0.0
    return float(lo), float(hi)


def mse(x):
    lo, hi = float(x.min()), float(x.max())
    best = None
    for i in range(80):
        s = 1.0 - 0.01 * i
        err = ((fake_quant_symmetric(x, lo * s, hi * s) - x) ** 2).sum()
        if best is None or err < best[0]:
            best = (err, lo * s, hi * s)
    return best[1], best[2]


def kl_threshold(x, bins=4096, levels=128):
    """TensorRT's entropy calibration on the |x| histogram, as published (S. Migacz, GTC 2017)."""
    r = float(np.abs(x).max())
    width = 2 * r / bins
    idx = np.clip(np.floor((x.astype(np.float64) + r) / width), 0, bins - 1).astype(np.int64)
    signed = np.bincount(idx, minlength=bins).astype(np.float64)
    hist = signed[bins // 2:] + signed[:bins // 2][::-1]
    n = len(hist)
    while n > 0 and hist[n - 1] == 0:
        n -= 1
    best_kl, best_i = math.inf, n
    for i in range(levels, n + 1):
        p = hist[:i].copy()
        p[i - 1] += hist[i:n].sum()
        merged = i // levels
        q = np.zeros(i)
        for g in range(levels):
            start, stop = g * merged, (i if g == levels - 1 else (g + 1) * merged)
            chunk = hist[start:stop]
            nz = np.count_nonzero(chunk)
            if nz:
                q[start:stop] = np.where(chunk != 0, chunk.sum() / nz, 0.0)
        p = p / p.sum()
        q = q / q.sum()
        mask = p > 0
        qq = np.where(q[mask] > 0, q[mask], 1e-10)
        kl = float((p[mask] * np.log(p[mask] / qq)).sum())
        if kl < best_kl:
            best_kl, best_i = kl, i
    t = best_i * (r / (bins // 2))
    return -t, t


def aciq(x, distribution, bits=8):
    if distribution == "laplace":
        b = float(np.abs(x - x.mean()).mean())
        clip = {8: 9.89, 4: 5.03}[bits] * b
    else:
        sigma = (float(x.max()) - float(x.min())) * 0.175 * (1 + math.sqrt(math.pi * math.log(4))) / math.sqrt(2 * math.log(x.size))
        clip = {8: 3.92, 4: 2.55}[bits] * sigma
    return -clip, clip


def main(out):
    rng = np.random.default_rng(0)
    x = rng.laplace(0.0, 0.5, 8192).astype(np.float32)
    x[:6] = [7.5, -6.0, 5.2, 9.1, -8.3, 6.6]  # outliers the clipping observers should cut
    np.save(os.path.join(out, "data.npy"), x)
    xd = x.astype(np.float64)
    ref = {
        "minmax": [float(x.min()), float(x.max())],
        "percentile_1e-3": list(percentile(xd, 1e-3)),
        "percentile_1e-2": list(percentile(xd, 1e-2)),
        "mse": list(mse(xd)),
        "kl_histogram": list(kl_threshold(xd)),
        "aciq_laplace": list(aciq(xd, "laplace")),
        "aciq_gaus": list(aciq(xd, "gaus")),
        "aciq_laplace_4bit": list(aciq(xd, "laplace", 4)),
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
