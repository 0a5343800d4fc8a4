#!/usr/bin/env python3
"""Writes the template's test model and calibration data (fixed seed):
   layer_scale_mlp.onnx  x[N,16] -> MatMul -> Add(bias) -> com.example:LayerScale -> Relu -> Gemm -> y[N,10]
   calib/batch_*.npy     4 batches of 8 samples
   eval.npy              the same 32 samples in one array

    /usr/bin/python3 examples/plugin-template/model/make_model.py examples/plugin-template/model
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main(out):
    rng = np.random.default_rng(0)
    f32 = lambda a: a.astype(np.float32)
    inits = [
        numpy_helper.from_array(f32(rng.standard_normal((16, 32)) * 0.3), "w1"),
        numpy_helper.from_array(f32(rng.standard_normal(32) * 0.1), "b1"),
        numpy_helper.from_array(f32(rng.uniform(0.2, 1.5, 32)), "gamma"),
        numpy_helper.from_array(f32(rng.standard_normal((10, 32)) * 0.3), "w2"),
        numpy_helper.from_array(f32(rng.standard_normal(10) * 0.1), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("LayerScale", ["hb", "gamma"], ["s"], name="layer_scale", domain="com.example"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", transB=1),
    ]
    graph = helper.make_graph(nodes, "layer_scale_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, producer_name="make_model.py",
                              opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    model.ir_version = 7
    onnx.save(model, os.path.join(out, "layer_scale_mlp.onnx"))
    os.makedirs(os.path.join(out, "calib"), exist_ok=True)
    batches = [f32(rng.standard_normal((8, 16))) for _ in range(4)]
    for i, b in enumerate(batches):
        np.save(os.path.join(out, "calib", f"batch_{i}.npy"), b)
    np.save(os.path.join(out, "eval.npy"), np.concatenate(batches))


if __name__ == "__main__":
    main(sys.argv[1])
