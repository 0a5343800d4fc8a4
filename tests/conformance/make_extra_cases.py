#!/usr/bin/env python3
"""Writes backend-test cases (ONNX's test-data layout) for ops whose opsets are newer than the
installed ONNX test data (Gelu-20, Mish-18, GroupNormalization-18/21), with PyTorch computing
the expected outputs:

    /usr/bin/python3 tests/conformance/make_extra_cases.py tests/conformance/extra
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper


def case(root, name, op, opset, inputs, outputs, **attrs):
    folder = os.path.join(root, name)
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(outputs[0].shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    for kind, arrays in (("input", inputs), ("output", outputs)):
        for i, a in enumerate(arrays):
            with open(os.path.join(folder, "test_data_set_0", f"{kind}_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(np.ascontiguousarray(a, dtype=np.float32)).SerializeToString())


def main(root):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, generator=g) * 3
    case(root, "test_gelu_default", "Gelu", 20, [x.numpy()], [F.gelu(x).numpy()])
    case(root, "test_gelu_tanh", "Gelu", 20, [x.numpy()], [F.gelu(x, approximate="tanh").numpy()], approximate="tanh")
    case(root, "test_mish", "Mish", 18, [x.numpy()], [F.mish(x).numpy()])
    x = torch.randn(2, 6, 4, 3, generator=g) * 2 + 1
    w, b = torch.rand(6, generator=g) + 0.5, torch.randn(6, generator=g)
    case(root, "test_group_normalization_per_channel", "GroupNormalization", 21,
         [x.numpy(), w.numpy(), b.numpy()], [F.group_norm(x, 3, w, b, eps=1e-5).numpy()], num_groups=3, epsilon=1e-5)
    gw, gb = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
    y = F.group_norm(x, 3, gw.repeat_interleave(2), gb.repeat_interleave(2), eps=1e-3)
    case(root, "test_group_normalization_per_group", "GroupNormalization", 18,
         [x.numpy(), gw.numpy(), gb.numpy()], [y.numpy()], num_groups=3, epsilon=1e-3)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__))
