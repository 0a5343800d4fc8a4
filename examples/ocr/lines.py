#!/usr/bin/env python3
"""Text lines rendered with Debian's DejaVu fonts (fonts-dejavu-core), for the OCR recognizer.

Each line is 4 to 16 characters of 0-9, A-Z and a-z in one of twelve DejaVu faces (16 to 26
points), 32 pixels high, as wide as the text (a multiple of 4), with random size, baseline, ink,
background (contrast down to 60 of 255 levels), blur and noise; white text value 1 on 0 after
inversion. Upper and lower case of the same shape (Oo, Ss, Cc, ...) differ only in size, so the
task keeps some ambiguity. Deterministic for a seed. The fonts are looked for in
DEJAVU_FONT_DIR when set.

    /usr/bin/python3 examples/ocr/lines.py OUT_DIR --count 200 --seed 2 [--width 192]

writes OUT_DIR/line_0000.npy ... (float32 [1, 32, W]) and OUT_DIR/labels.txt (one text per
line). With --width every line is padded (or squeezed) to that width, so that batches and
saved outputs stack.
"""
import argparse
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

CHARSET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
FONT_DIR = os.environ.get("DEJAVU_FONT_DIR", "/usr/share/fonts/truetype/dejavu")
FACES = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
         "DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf",
         "DejaVuSansCondensed.ttf", "DejaVuSansCondensed-Bold.ttf", "DejaVuSerifCondensed.ttf",
         "DejaVuSans-ExtraLight.ttf"]
HEIGHT = 32

_fonts = {}


def font(face, size):
    key = (face, size)
    if key not in _fonts:
        _fonts[key] = ImageFont.truetype(os.path.join(FONT_DIR, face), size)
    return _fonts[key]


def render(text, rng, width=None):
    """One line as a float32 [1, 32, W] array, text bright on dark."""
    f = font(FACES[rng.integers(len(FACES))], int(rng.integers(16, 27)))
    left, top, right, bottom = f.getbbox(text)
    w = right - left + int(rng.integers(4, 14))
    w = (w + 3) // 4 * 4
    bg = int(rng.integers(170, 256))
    ink = int(rng.integers(0, max(1, bg - 60)))
    img = Image.new("L", (w, HEIGHT), bg)
    draw = ImageDraw.Draw(img)
    y = (HEIGHT - (bottom - top)) // 2 - top + int(rng.integers(-2, 3))
    draw.text((int(rng.integers(1, 5)) - left, y), text, font=f, fill=ink)
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.3))))
    a = 1.0 - np.asarray(img, dtype=np.float32) / 255.0
    a = a + rng.normal(0, float(rng.uniform(0.0, 0.1)), a.shape).astype(np.float32)
    if width is not None:
        if a.shape[1] > width:  # squeeze a long line, as a fixed-width pipeline would
            a = np.asarray(Image.fromarray(a).resize((width, HEIGHT), Image.BILINEAR), dtype=np.float32)
        else:
            a = np.pad(a, ((0, 0), (0, width - a.shape[1])))
    return np.clip(a, 0, 1).astype(np.float32)[None]


def random_text(rng):
    n = int(rng.integers(4, 17))
    return "".join(CHARSET[i] for i in rng.integers(len(CHARSET), size=n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--width", type=int, default=None)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    texts = []
    for i in range(a.count):
        t = random_text(rng)
        np.save(os.path.join(a.out, "line_%04d.npy" % i), render(t, rng, a.width))
        texts.append(t)
    with open(os.path.join(a.out, "labels.txt"), "w") as f:
        f.write("\n".join(texts) + "\n")


if __name__ == "__main__":
    main()
