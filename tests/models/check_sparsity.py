#!/usr/bin/env python3
"""Checks a pruned model's weights against the original, with the onnx package only (independent
of sparsebit): every Conv / ConvTranspose / Gemm / MatMul weight initializer of ORIGINAL is
compared with the one of the same node in PRUNED.

    check_sparsity.py ORIGINAL PRUNED --nm 2:4      at most N non-zeros in every M consecutive
                                                    weights along the input channels (layers whose
                                                    input channels are not a multiple of M: unchanged)
    check_sparsity.py ORIGINAL PRUNED --ratio 0.5   floor(ratio * size) zeros in every weight, the
                                                    smallest ones, the others unchanged
Exits 1 on the first violation.
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def weights(path):
    m = onnx.load(path)
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(n.input) < 2 or n.input[1] not in init:
            continue
        w = init[n.input[1]]
        if w.ndim < 2:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Conv":
            axis = 1
        elif n.op_type == "ConvTranspose":
            axis = 0
        elif n.op_type == "Gemm":
            axis = 1 if attrs.get("transB", 0) else 0
        else:
            axis = 0
        out[n.name] = (w, axis)
    return out


def main():
    original, pruned = weights(sys.argv[1]), weights(sys.argv[2])
    mode, value = sys.argv[3], sys.argv[4]
    checked = 0
    for name, (w, axis) in original.items():
        p, _ = pruned[name]
        assert p.shape == w.shape, f"{name}: shape {p.shape} != {w.shape}"
        kept = p != 0
        assert np.array_equal(p[kept], w[kept]), f"{name}: kept weights changed"
        if mode == "--nm":
            n, m = (int(v) for v in value.split(":"))
            if w.shape[axis] % m:
                assert np.array_equal(p, w), f"{name}: {w.shape[axis]} input channels, yet pruned"
                continue
            groups = np.moveaxis(p, axis, -1).reshape(-1, m)
            worst = int((groups != 0).sum(1).max())
            assert worst <= n, f"{name}: a group of {m} has {worst} non-zeros"
            # The kept ones are the largest of their group.
            g_w = np.abs(np.moveaxis(w, axis, -1).reshape(-1, m))
            g_k = groups != 0
            assert (np.where(g_k, g_w, np.inf).min(1) >= np.where(g_k, -np.inf, g_w).max(1)).all(), f"{name}: not the largest"
        else:
            ratio = float(value)
            zeros = int((~kept).sum())
            want = int(np.floor(ratio * w.size))
            assert zeros == want, f"{name}: {zeros} zeros, expected {want}"
            assert np.abs(w[~kept]).max() <= np.abs(w[kept]).min(), f"{name}: a kept weight is smaller than a pruned one"
        checked += 1
    assert checked > 0, "no weight checked"
    print(f"{sys.argv[2]}: {checked} weights checked ({mode} {value})")


if __name__ == "__main__":
    main()
