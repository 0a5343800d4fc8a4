#!/usr/bin/env python3
"""A keyword-spotting CNN in the shape tf2onnx writes, trained here on synthesized spectrograms.

    make_tf_style.py OUT_DIR [--steps N]

The network (four convolutions, LeakyRelu / ReLU6 activations, max pooling, global average,
an embedding layer and a 4-way sigmoid head) is trained with torch on CPU on log-spectrogram-like
inputs of four synthesized "keywords" (class templates of smooth time-frequency blobs, shifted
in time, with noise and level changes), exported at opset 13 and rewritten into TensorFlow's
layout as tf2onnx leaves it:
  - the input is NHWC (input_1 [batch, 40, 32, 1]) with a Transpose to NCHW in front;
  - each activation runs in NHWC between Transposes (NCHW -> NHWC -> NCHW);
  - LeakyRelu is written as Max(x, alpha * x), ReLU6 as Max(x, 0) then Min(x, 6);
  - strided convolutions take TensorFlow's SAME padding as a separate Pad;
  - the dense layers are MatMul + Add behind a Shape / Gather / Concat / Reshape chain.
Writes OUT_DIR/model.onnx (outputs "embedding" [batch, 32] and "scores" [batch, 4]), calib/ (64
samples) and eval/ (256 held-out samples), one .npy per sample, NHWC, input_name and info.json.
"""
import argparse
import json
import os

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn

H, W, CLASSES = 40, 32, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.c4 = nn.Conv2d(32, 64, 3, stride=2)
        self.emb = nn.Linear(64, 32)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x):
        x = nn.functional.leaky_relu(self.c1(x), 0.2)
        x = nn.functional.leaky_relu(self.c2(nn.functional.pad(x, (0, 1, 0, 1))), 0.2)  # SAME, stride 2
        x = nn.functional.max_pool2d(nn.functional.relu6(self.c3(x)), 2)
        x = nn.functional.leaky_relu(self.c4(nn.functional.pad(x, (0, 1, 0, 1))), 0.1)
        e = self.emb(x.mean((2, 3)))
        return e, torch.sigmoid(self.head(e))


def templates(rng):
    """Each class: a few smooth blobs in (frequency, time)."""
    f, t = np.mgrid[0:H, 0:W].astype(np.float32)
    out = []
    for _ in range(CLASSES):
        img = np.zeros((H, W), np.float32)
        for _ in range(4):
            cf, ct = rng.uniform(4, H - 4), rng.uniform(6, W - 6)
            sf, st = rng.uniform(1.5, 5), rng.uniform(1.5, 4)
            img += rng.uniform(0.5, 1.5) * np.exp(-((f - cf) / sf) ** 2 - ((t - ct) / st) ** 2)
        out.append(img)
    return out


def samples(rng, tmpl, n):
    x = np.empty((n, H, W, 1), np.float32)
    y = rng.integers(0, CLASSES, n)
    for i in range(n):
        img = np.roll(tmpl[y[i]], int(rng.integers(-5, 6)), axis=1) * rng.uniform(0.5, 2.0)
        img = img + rng.normal(0, 0.15, (H, W)).astype(np.float32) + rng.uniform(0, 0.3)
        x[i, :, :, 0] = np.log1p(np.maximum(img, 0) * 20)  # log-magnitude, as features are
    return x, y


def to_tf_layout(model):
    """Rewrites the torch export into tf2onnx's habits (see the module's docstring)."""
    g = model.graph
    nodes, inits = [], {i.name: i for i in g.initializer}
    count = [0]

    def fresh(base):
        count[0] += 1
        return f"{base}__{count[0]}"

    def const(name, value):
        g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    old_input = g.input[0].name
    g.input[0].CopyFrom(helper.make_tensor_value_info("input_1", onnx.TensorProto.FLOAT, ["batch", H, W, 1]))
    nodes.append(helper.make_node("Transpose", ["input_1"], [old_input], perm=[0, 3, 1, 2], name="input_1/nchw"))
    for n in g.node:
        if n.op_type in ("LeakyRelu", "Clip"):
            x, y = n.input[0], n.output[0]
            nhwc, act = fresh(x + "/nhwc"), fresh(y + "/nhwc")
            nodes.append(helper.make_node("Transpose", [x], [nhwc], perm=[0, 2, 3, 1], name=fresh("to_nhwc")))
            if n.op_type == "LeakyRelu":
                alpha = next(a.f for a in n.attribute if a.name == "alpha")
                scaled = fresh(y + "/scaled")
                nodes.append(helper.make_node("Mul", [nhwc, const(fresh("alpha"), np.float32(alpha))], [scaled],
                                              name=fresh("leaky/mul")))
                nodes.append(helper.make_node("Max", [nhwc, scaled], [act], name=fresh("leaky/max")))
            else:
                low = fresh(y + "/relu")
                nodes.append(helper.make_node("Max", [nhwc, const(fresh("zero"), np.float32(0))], [low],
                                              name=fresh("relu6/max")))
                nodes.append(helper.make_node("Min", [low, const(fresh("six"), np.float32(6))], [act],
                                              name=fresh("relu6/min")))
            nodes.append(helper.make_node("Transpose", [act], [y], perm=[0, 3, 1, 2], name=fresh("to_nchw")))
        elif n.op_type == "Gemm":
            x, w, b = n.input
            trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
            wt = numpy_helper.to_array(inits[w])
            kernel = const(fresh(w + "/kernel"), (wt.T if trans_b else wt).copy())
            # The Reshape chain tf2onnx writes in front of a Dense layer: [batch, -1] from Shape.
            shape, batch, target, flat, prod = (fresh(x + s) for s in ("/shape", "/batch", "/target", "/flat", "/mm"))
            nodes += [helper.make_node("Shape", [x], [shape], name=fresh("flatten/shape")),
                      helper.make_node("Gather", [shape, const(fresh("zero_i"), np.array([0], np.int64))], [batch],
                                       axis=0, name=fresh("flatten/gather")),
                      helper.make_node("Concat", [batch, const(fresh("minus_one"), np.array([-1], np.int64))],
                                       [target], axis=0, name=fresh("flatten/concat")),
                      helper.make_node("Reshape", [x, target], [flat], name=fresh("flatten/reshape")),
                      helper.make_node("MatMul", [flat, kernel], [prod], name=fresh("dense/matmul")),
                      helper.make_node("Add", [prod, b], [n.output[0]], name=fresh("dense/add"))]
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    del g.value_info[:]
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    tmpl = templates(rng)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for step in range(a.steps):
        x, y = samples(rng, tmpl, 64)
        _, p = net(torch.from_numpy(x).permute(0, 3, 1, 2))
        loss = nn.functional.binary_cross_entropy(p, nn.functional.one_hot(torch.from_numpy(y), CLASSES).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    os.makedirs(a.out, exist_ok=True)
    ref = os.path.join(a.out, "reference_nchw.onnx")
    legacy = {"dynamo": False} if int(torch.__version__.split(".")[0]) >= 2 else {}
    torch.onnx.export(net, torch.zeros(1, 1, H, W), ref, opset_version=13, input_names=["x"],
                      output_names=["embedding", "scores"], dynamic_axes={"x": {0: "batch"}}, **legacy)
    model = to_tf_layout(onnx.load(ref))
    onnx.save(model, os.path.join(a.out, "model.onnx"))
    os.remove(ref)
    with open(os.path.join(a.out, "input_name"), "w") as f:
        f.write("input_1")
    ex, ey = samples(np.random.default_rng(2), tmpl, 256)
    with torch.no_grad():
        _, p = net(torch.from_numpy(ex).permute(0, 3, 1, 2))
    accuracy = float((p.argmax(1).numpy() == ey).mean())
    for name, (x, _) in (("calib", samples(np.random.default_rng(1), tmpl, 64)), ("eval", (ex, ey))):
        os.makedirs(os.path.join(a.out, name), exist_ok=True)
        for i in range(len(x)):
            np.save(os.path.join(a.out, name, f"{i:03d}.npy"), x[i:i + 1])
    info = {"steps": a.steps, "final_loss": float(loss), "eval_accuracy": accuracy,
            "nodes": len(model.graph.node), "ops": sorted({n.op_type for n in model.graph.node})}
    json.dump(info, open(os.path.join(a.out, "info.json"), "w"), indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
