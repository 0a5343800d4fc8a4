#!/usr/bin/env python3
"""Page crops for the text detector: 64 pixels high, 96 to 256 wide (a multiple of 8), with one
to three text lines from lines.py scaled to 12-24 pixels high on a cluttered background (noise,
strokes, blobs), and the target probability map: 1 inside each line's text box, shrunk by a
pixel as segmentation detectors (DBNet, PSENet) train on. Deterministic for a seed.

    /usr/bin/python3 examples/ocr/pages.py OUT_DIR --count 16 --seed 5 [--width 192]

writes OUT_DIR/page_0000.npy ... (float32 [1, 64, W]) and, with --masks, OUT_DIR/masks/.
"""
import argparse
import os

import numpy as np
from PIL import Image

import lines

HEIGHT = 64


def page(rng, width=None):
    w = width or int(rng.integers(12, 33)) * 8
    img = np.full((HEIGHT, w), float(rng.uniform(0.0, 0.3)), np.float32)
    mask = np.zeros((HEIGHT, w), np.float32)
    for _ in range(int(rng.integers(0, 4))):  # clutter: strokes and blobs that are not text
        y, x = int(rng.integers(0, HEIGHT)), int(rng.integers(0, w))
        if rng.random() < 0.5:
            img[max(0, y - 1):y + 1, x:x + int(rng.integers(10, 60))] += float(rng.uniform(0.3, 0.8))
        else:
            r = int(rng.integers(2, 6))
            img[max(0, y - r):y + r, max(0, x - r):x + r] += float(rng.uniform(0.2, 0.6))
    taken = []
    for _ in range(int(rng.integers(1, 4))):
        line = lines.render(lines.random_text(rng)[:int(rng.integers(3, 9))], rng)[0]
        h = int(rng.integers(12, 25))
        lw = max(8, int(line.shape[1] * h / 32))
        if lw >= w - 2:
            lw = w - 4
        line = np.asarray(Image.fromarray(line).resize((lw, h), Image.BILINEAR), np.float32)
        line = np.clip(line - np.median(line), 0, 1)  # the ink only, on the page's background
        for _ in range(10):  # a place that overlaps no other line
            y, x = int(rng.integers(0, HEIGHT - h + 1)), int(rng.integers(0, w - lw + 1))
            if all(y + h <= ty or ty + th <= y or x + lw <= tx or tx + tw <= x for ty, tx, th, tw in taken):
                break
        else:
            continue
        taken.append((y, x, h, lw))
        region = img[y:y + h, x:x + lw]
        img[y:y + h, x:x + lw] = np.maximum(region, line)
        ink = np.argwhere(line > 0.15)
        if len(ink):
            (y0, x0), (y1, x1) = ink.min(0), ink.max(0)
            mask[y + y0 + 1:y + y1, x + x0 + 1:x + x1] = 1
    img += rng.normal(0, float(rng.uniform(0.01, 0.05)), img.shape).astype(np.float32)
    return np.clip(img, 0, 1)[None], mask[None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--masks", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.masks:
        os.makedirs(os.path.join(a.out, "masks"), exist_ok=True)
    rng = np.random.default_rng(a.seed)
    for i in range(a.count):
        x, m = page(rng, a.width)
        np.save(os.path.join(a.out, "page_%04d.npy" % i), x)
        if a.masks:
            np.save(os.path.join(a.out, "masks", "page_%04d.npy" % i), m)


if __name__ == "__main__":
    main()
