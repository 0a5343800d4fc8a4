#!/usr/bin/env python3
"""A corpus of hostile graphs through `sparsebit quantize`, as a user would run it.

Each case is a small ONNX model that is malformed, or valid but built to hang or exhaust the
machine. Every run must end within its time limit with status 0 (and a model ONNX's checker
accepts) or status 1 with one message naming what to fix; never a signal, a hang or a half file.
Usage: hostile_graphs.py SPARSEBIT_BINARY
(Loops run at most SPARSEBIT_MAX_LOOP_ITERATIONS = 100000 times here, to keep the run short.)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def model(nodes, inits, outputs=None, opset=16, inputs=None):
    inputs = inputs or [helper.make_tensor_value_info("x", F, ["n", 4])]
    outputs = outputs or [helper.make_tensor_value_info("y", F, None)]
    g = helper.make_graph(nodes, "hostile", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def loop_model(trips, condition=True):
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["h", "one"], ["h_next"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("h", F, None)],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("h_next", F, None)],
        [const("one", 1.0)])
    return model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                  helper.make_node("Loop", ["trips", "yes" if condition else "", "m"], ["y"], name="endless_loop",
                                   body=body)],
                 [const("w", np.eye(4)), const("trips", trips, np.int64), const("yes", True, np.bool_)])


def if_model(then_value, else_value, name="branchy"):
    def branch(tag, value):
        return helper.make_graph([helper.make_node("Identity", [f"k{tag}"], [f"o{tag}"])], f"b{tag}", [],
                                 [helper.make_tensor_value_info(f"o{tag}", value.dtype == np.float32 and F or I64,
                                                                None)],
                                 [numpy_helper.from_array(value, f"k{tag}")])
    return model([helper.make_node("ReduceMean", ["x"], ["s"], keepdims=0),
                  helper.make_node("Greater", ["s", "zero"], ["c"]),
                  helper.make_node("If", ["c"], ["v"], name=name, then_branch=branch("t", then_value),
                                   else_branch=branch("e", else_value)),
                  helper.make_node("MatMul", ["x", "w"], ["m"]),
                  helper.make_node("Mul", ["m", "v"], ["y"])],
                 [const("zero", 0.0), const("w", np.eye(4))])


def nested_ifs(depth):
    inner = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["o0"])], "b0", [],
                              [helper.make_tensor_value_info("o0", F, None)])
    for d in range(1, depth + 1):  # the other branch is small: the model grows linearly
        other = helper.make_graph([helper.make_node("Neg", ["x"], [f"n{d}"])], f"n{d}", [],
                                  [helper.make_tensor_value_info(f"n{d}", F, None)])
        inner = helper.make_graph([helper.make_node("If", ["c"], [f"o{d}"], then_branch=inner, else_branch=other)],
                                  f"b{d}", [], [helper.make_tensor_value_info(f"o{d}", F, None)])
    return model([helper.make_node("ReduceMean", ["x"], ["s"], keepdims=0),
                  helper.make_node("Greater", ["s", "zero"], ["c"]),
                  helper.make_node("If", ["c"], ["y"], name="outer", then_branch=inner, else_branch=inner)],
                 [const("zero", 0.0), const("w", np.eye(4))])


def cases():
    mm = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    w = const("w", np.eye(4))
    yield "negative Loop trip count (runs zero times)", loop_model(-5), 0, []
    yield "Loop of 2^40 trips", loop_model(1 << 40), 1, ["endless_loop", "still running after 100000 iterations"]
    yield "Loop of 10^12 trips and no condition (refused before the first)", loop_model(10**12, condition=False), 1, \
        ["endless_loop", "trip count 1000000000000 is beyond the 100000 iterations"]
    yield "If branches of different element types", if_model(np.ones(1, np.float32), np.ones(1, np.int64)), 1, \
        ["branchy", "float", "int64"]
    yield "If nested 25 deep", nested_ifs(25), 0, []
    yield "If nested 40 deep (beyond protobuf's default depth)", nested_ifs(40), 1, ["nests If/Loop/Scan bodies deeper"]
    yield "a cycle", model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                            helper.make_node("Add", ["a", "a2"], ["b"], name="second"),
                            helper.make_node("Relu", ["b"], ["a2"], name="third"),
                            helper.make_node("Identity", ["a"], ["y"])], []), 1, ["cycle"]
    yield "an input nothing produces", model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="orphan")], []), \
        1, ["orphan", "nowhere"]
    yield "two nodes writing one value", model([mm, helper.make_node("Relu", ["x"], ["y"], name="again")], [w]), 1, \
        ["'y'"]
    yield "an output nothing produces", model([mm], [w], outputs=[helper.make_tensor_value_info("z", F, None)]), 1, \
        ["'z'"]
    yield "an Expand to 2^64 elements", model(
        [helper.make_node("Expand", ["x", "huge"], ["e"], name="bomb"), helper.make_node("MatMul", ["e", "w"], ["y"])],
        [w, const("huge", [1 << 31, 1 << 31, 4], np.int64)]), 1, ["bomb"]
    yield "an op no plugin has", model([helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery",
                                                          domain="com.example")], [],
                                        opset=16), 1, ["mystery", "NoSuchOp"]
    yield "a MatMul of mismatched widths", model([helper.make_node("MatMul", ["x", "w3"], ["y"], name="narrow")],
                                                 [const("w3", np.ones((3, 2)))]), 1, ["narrow"]


def main():
    binary = os.path.abspath(sys.argv[1])
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        np.save(os.path.join(work, "x.npy"), np.random.RandomState(0).randn(8, 4).astype(np.float32))
        with open(os.path.join(work, "c.toml"), "w") as f:
            f.write('backend = "onnxruntime"\n[calibration]\nbatch_size = 4\n')
        for k, (what, m, expected, needles) in enumerate(cases()):
            if any(o.name == "z" for o in m.graph.output) or what == "an op no plugin has":
                m.opset_import.append(helper.make_opsetid("com.example", 1))
            path, out = os.path.join(work, f"h{k}.onnx"), os.path.join(work, f"q{k}.onnx")
            onnx.save(m, path)
            try:
                run = subprocess.run([binary, "-q", "quantize", path, "-c", os.path.join(work, "c.toml"), "--calib",
                                      os.path.join(work, "x.npy"), "-o", out], capture_output=True, text=True,
                                     timeout=120, env=dict(os.environ, SPARSEBIT_MAX_LOOP_ITERATIONS="100000"))
                status, err = run.returncode, run.stderr.strip()
            except subprocess.TimeoutExpired:
                status, err = "a hang (120 s)", ""
            problems = []
            if status != expected:
                problems.append(f"status {status}, expected {expected}")
            missing = [n for n in needles if n not in err]
            if missing:
                problems.append(f"message lacks {missing}")
            if expected == 0 and status == 0:
                onnx.checker.check_model(onnx.load(out), full_check=True)
            elif os.path.exists(out):
                problems.append("an output was written")
            if problems:
                failures += 1
                print(f"FAIL: {what}: {'; '.join(problems)}: {err[-600:]}")
            else:
                print(f"ok: {what}: " + (err.splitlines()[-1] if err else "quantized"))
    if failures:
        sys.exit(1)
    print("hostile graphs: all ended with a model or one clear message")


if __name__ == "__main__":
    main()
