#!/usr/bin/env python3
"""Writes old-opset test models the way real exporters make them, with dynamic dims, and
calibration/evaluation samples in the layout of make_models.py (NAME/model.onnx, NAME/calib,
NAME/eval, NAME/input_name):

- torch_ocr_opsetN (N = 9, 10, 11, 12): a text-line recognizer exported by torch.onnx at opset N
  with dynamic batch and width: Conv, BatchNorm, ReLU6 (Clip with attributes up to opset 10),
  nn.Upsample (Upsample at 9, Resize-10 at 10), an attention block whose Softmax runs on axis 3
  of a 4-D tensor, view() on dims read with Shape/Gather, torch.split (Split with a `split`
  attribute), mean over time (ReduceMean) and a LogSoftmax classifier head (axis 1 of 2-D).
- paddle_style_opsetN (N = 9, 11): built node by node in the shapes Paddle2ONNX writes: Shape ->
  Slice -> Concat -> Reshape chains over symbolic dims, Clip/Pad/Slice with attributes (9) or
  inputs (11), Softmax on axis 3 of 4-D (last) and on axis 1 of a 3-D tensor (not last: before
  opset 13 it normalizes over the flattened tail), ReduceSum/Unsqueeze/Squeeze/Split with
  attributes, TopK with a `k` attribute (9), and a Softmax head on axis 1 of 2-D.

- onnx_testdata: ONNX's own old-opset models (libonnx-testdata's pytorch-converted and
  pytorch-operator suites, opset 6: converted to 7 by ONNX's converter, lifted from there by
  ours) with one float input, one output and a Conv/ConvTranspose/Gemm/MatMul: each goes to
  onnx_<test name>/, calibrated on its test input with noise; reference.onnx beside it is ONNX's
  own conversion to opset 13, the float reference ONNX Runtime runs (it refuses some opset-6 ops).

Calibration samples of the models above are text lines of different widths, one per .npy file;
the evaluation batch has a width no calibration sample has.

    /usr/bin/python3 tests/models/make_old_opset_models.py OUT_DIR [NAME ...]
"""
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper, version_converter

from fixture_layout import write_layout

TORCH_OPSETS = (9, 10, 11, 12)
PADDLE_OPSETS = (9, 11)
ALL = [f"torch_ocr_opset{o}" for o in TORCH_OPSETS] + [f"paddle_style_opset{o}" for o in PADDLE_OPSETS] + ["onnx_testdata"]
TESTDATA = "/usr/share/libonnx-testdata/data"
CALIB_WIDTHS = (12, 16, 20, 24, 12, 16, 20, 24)
EVAL_WIDTH = 28


class TextRecognizer(nn.Module):
    def __init__(self, dim=32, heads=2, classes=12):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.half = dim // 2
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.act = nn.ReLU6()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, dim, (8, 1))
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.pool(self.up(self.act(self.bn1(self.conv1(x)))))
        h = self.conv2(h).squeeze(2).permute(0, 2, 1)  # [batch, width, dim]
        b, t, d = h.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        h = h + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        left, right = torch.split(h, [self.half, self.half], dim=-1)
        return torch.log_softmax(self.head(torch.cat([right, left], -1).mean(1)), dim=1)


def export_torch(opset, path):
    torch.manual_seed(opset)
    model = TextRecognizer().eval()
    with torch.no_grad():
        for p in model.bn1.parameters():
            p.uniform_(0.5, 1.5)
        model.bn1.running_mean.uniform_(-0.2, 0.2)
        model.bn1.running_var.uniform_(0.5, 1.5)
    torch.onnx.export(model, torch.rand(1, 1, 8, 16), path, opset_version=opset, input_names=["image"],
                      output_names=["log_probs"], dynamic_axes={"image": {0: "batch", 3: "width"}, "log_probs": {0: "batch"}},
                      do_constant_folding=True)
    return "image", (1, 8)


def paddle_style(opset, path):
    rng = np.random.default_rng(opset)
    inits = []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(name, *shape, scale=0.3):
        return const(name, rng.standard_normal(shape) * scale)

    old = opset < 11
    nodes = []

    def node(op, inputs, outputs, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=f"{op.lower()}_{len(nodes)}", **attrs))
        return outputs[0]

    def slice_(x, start, end, out):
        if old:
            return node("Slice", [x], [out], starts=[start], ends=[end])
        return node("Slice", [x, const(out + "_s", [start], np.int64), const(out + "_e", [end], np.int64)], [out])

    c1 = node("Conv", ["x", weight("w1", 16, 8, 3, 3), weight("b1", 16, scale=0.1)], ["c1"], pads=[1, 1, 1, 1])
    if old:
        r1 = node("Clip", [c1], ["r1"], min=0.0, max=6.0)
        p1 = node("Pad", [r1], ["p1"], pads=[0, 0, 0, 1, 0, 0, 0, 1], mode="constant", value=0.5)
    else:
        r1 = node("Clip", [c1, const("lo", 0.0), const("hi", 6.0)], ["r1"])
        p1 = node("Pad", [r1, const("pads", [0, 0, 0, 1, 0, 0, 0, 1], np.int64), const("pad_value", 0.5)], ["p1"],
                  mode="constant")
    c2 = node("Conv", [p1, weight("w2", 16, 16, 1, 3, scale=0.2)], ["c2"])  # [N, 16, 4, W]
    s = node("Shape", [c2], ["s"])
    n = slice_(s, 0, 1, "n")
    w = slice_(s, 3, 4, "w")
    seq = node("Reshape", [c2, node("Concat", [n, const("c64", [64], np.int64), w], ["shape_seq"], axis=0)], ["seq"])
    t = node("Transpose", [seq], ["t"], perm=[0, 2, 1])  # [N, W, 64]
    heads = node("Concat", [n, w, const("heads", [4, 16], np.int64)], ["shape_heads"], axis=0)
    proj = lambda name, perm: node("Transpose", [node("Reshape", [node("MatMul", [t, weight("w" + name, 64, 64, scale=0.15)],
                                                                       [name + "_flat"]), heads], [name + "_4d"])],
                                   [name], perm=perm)
    q, k, v = proj("q", [0, 2, 1, 3]), proj("k", [0, 2, 3, 1]), proj("v", [0, 2, 1, 3])
    scores = node("Mul", [node("MatMul", [q, k], ["qk"]), const("scale", 0.25)], ["scores"])
    att = node("Softmax", [scores], ["att"], axis=3)  # the last axis of 4-D
    o = node("MatMul", [att, v], ["o"])
    o = node("Reshape", [node("Transpose", [o], ["o_t"], perm=[0, 2, 1, 3]),
                         node("Concat", [n, w, const("c64b", [64], np.int64)], ["shape_o"], axis=0)], ["o_seq"])
    gate = node("Softmax", [o], ["gate"], axis=1)  # not the last axis: normalizes over W x 64 before opset 13
    pooled = node("ReduceSum", [node("Mul", [o, gate], ["gated"])], ["pooled"], axes=[1], keepdims=0)
    sq = node("Squeeze", [node("Unsqueeze", [pooled], ["pooled_3d"], axes=[2])], ["pooled_2d"], axes=[2])
    node("Split", [sq], ["half_a", "half_b"], axis=1, split=[32, 32])
    cat = node("Concat", ["half_b", "half_a"], ["swapped"], axis=1)
    logits = node("Gemm", [cat, weight("wf", 10, 64, scale=0.5), weight("bf", 10, scale=0.1)], ["logits"], transB=1)
    node("Softmax", [logits], ["probs"], axis=1)
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])]
    if old:
        node("TopK", [logits], ["top_values", "top_indices"], k=3, axis=1)
        outputs.append(helper.make_tensor_value_info("top_values", TensorProto.FLOAT, ["N", 3]))
    graph = helper.make_graph(nodes, f"paddle_style_opset{opset}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 4, "W"])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="paddle2onnx-style")
    model.ir_version = 5
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return "x", (8, 4)


def onnx_testdata(out):
    for suite in ("pytorch-converted", "pytorch-operator"):
        for test in sorted(os.listdir(os.path.join(TESTDATA, suite))):
            model = onnx.load(os.path.join(TESTDATA, suite, test, "model.onnx"))
            inits = {i.name for i in model.graph.initializer}
            inputs = [i for i in model.graph.input if i.name not in inits]
            ops = {n.op_type for n in model.graph.node}
            if (len(inputs) != 1 or len(model.graph.output) != 1 or inputs[0].type.tensor_type.elem_type != TensorProto.FLOAT
                    or not ops & {"Conv", "ConvTranspose", "Gemm", "MatMul"}):
                continue
            folder = os.path.join(out, "onnx_" + test)
            os.makedirs(folder, exist_ok=True)
            onnx.save(model, os.path.join(folder, "model.onnx"))
            # ONNX Runtime does not run every opset-6 op (Gemm-6): its float reference is ONNX's own
            # conversion of the model, independent of our lifting.
            onnx.save(version_converter.convert_version(model, 13), os.path.join(folder, "reference.onnx"))
            tensor = onnx.TensorProto()
            with open(os.path.join(TESTDATA, suite, test, "test_data_set_0", "input_0.pb"), "rb") as f:
                tensor.ParseFromString(f.read())
            x = numpy_helper.to_array(tensor).astype(np.float32)
            rng = np.random.default_rng(len(test))
            calib = [x + rng.standard_normal(x.shape).astype(np.float32) * np.float32(0.1) * np.abs(x).max()
                     for _ in range(8)]
            write_layout(folder, calib, x, inputs[0].name)
            print(f"onnx_{test} (opset {model.opset_import[0].version}): {folder}")


def export(name, out):
    if name == "onnx_testdata":
        return onnx_testdata(out)
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    opset = int(name.rsplit("opset", 1)[1])
    input_name, lead = (export_torch if name.startswith("torch") else paddle_style)(opset, path)
    rng = np.random.default_rng(100 + opset)
    # One text line per file, widths differ: the batcher must keep them apart.
    calib = [rng.random((1, *lead, w), dtype=np.float32) for w in CALIB_WIDTHS]
    write_layout(folder, calib, rng.random((2, *lead, EVAL_WIDTH), dtype=np.float32), input_name)
    print(f"{name}: {path}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for n in sys.argv[2:] or ALL:
        if n not in ALL:
            sys.exit(f"unknown model {n}; known: {' '.join(ALL)}")
        export(n, sys.argv[1])


if __name__ == "__main__":
    main()
