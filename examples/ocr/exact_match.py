#!/usr/bin/env python3
"""Exact-match accuracy of the text recognizer's outputs: greedy CTC decoding of a
[N, T, 63] .npy of probabilities (as `sparsebit quantize --eval-outputs` writes them)
against a labels.txt of N lines. Prints the percentage; --json prints {"exact_match": ...}.

    python3 examples/ocr/exact_match.py sim.npy test/labels.txt
"""
import json
import sys

import numpy as np

CHARSET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BLANK = len(CHARSET)


def decode(best):
    out, prev = [], BLANK
    for b in best:
        if b != prev and b != BLANK:
            out.append(CHARSET[b])
        prev = b
    return "".join(out)


def exact_match(outputs, labels):
    best = outputs.argmax(-1)
    if len(labels) != best.shape[0]:
        raise SystemExit("%d outputs but %d labels" % (best.shape[0], len(labels)))
    return 100.0 * np.mean([decode(best[i].tolist()) == labels[i] for i in range(len(labels))])


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 2:
        raise SystemExit(__doc__)
    outputs = np.load(args[0])
    labels = open(args[1]).read().split()
    score = exact_match(outputs, labels)
    print(json.dumps({"exact_match": score}) if "--json" in sys.argv else "%.2f" % score)


if __name__ == "__main__":
    main()
