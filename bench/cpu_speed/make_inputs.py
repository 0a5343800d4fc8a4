#!/usr/bin/env python3
"""Calibration inputs for bench/cpu_speed/run.sh, one .npy per sample, seeded:
  images: COUNT random [3, 224, 224] images in [0, 1);
  lines:  COUNT rendered text lines [1, 32, W] of many widths (examples/ocr/lines.py);
  pages:  COUNT rendered pages [1, 64, 320] (examples/ocr/pages.py).

    /usr/bin/python3 bench/cpu_speed/make_inputs.py KIND COUNT OUT_DIR
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "ocr"))


def main():
    kind, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(count):
        if kind == "images":
            x = rng.random((3, 224, 224), dtype=np.float32)
        elif kind == "lines":
            import lines
            x = lines.render(lines.random_text(rng), rng)
        elif kind == "pages":
            import pages
            x = pages.page(rng, 320)[0]
        else:
            sys.exit("unknown kind " + kind)
        np.save(os.path.join(out, "%03d.npy" % i), x)


if __name__ == "__main__":
    main()
