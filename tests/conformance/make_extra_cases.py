#!/usr/bin/env python3
"""Writes backend-test cases (ONNX's test-data layout) for ops whose opsets are newer than the
installed ONNX test data (Gelu-20, Mish-18, GroupNormalization-18/21) and for options ONNX's own
recurrent tests leave out (both directions, sequence_lens, layout 1, GRU's linear_before_reset,
clip, activations with parameters), for DFT's input form of opset 20 and for the sequence ops
the test data has no cases for, with PyTorch (or, where PyTorch has no such option, a plain
numpy loop over the spec's equations, or numpy's FFT) computing the expected outputs:

    /usr/bin/python3 tests/conformance/make_extra_cases.py tests/conformance/extra
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, mapping, numpy_helper


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


def write(root, name, node, opset, inputs, outputs):
    """A model of one node (or a list of nodes); inputs and outputs are lists of (name, array); an
    input named "" is an omitted optional input."""
    folder = os.path.join(root, name)
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    info = lambda n, a: helper.make_tensor_value_info(n, mapping.NP_TYPE_TO_TENSOR_TYPE[a.dtype], list(a.shape))
    graph = helper.make_graph(node if isinstance(node, list) else [node], name, [info(n, a) for n, a in inputs if n],
                              [info(n, a) for n, a in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    for kind, arrays in (("input", [(n, a) for n, a in inputs if n]), ("output", outputs)):
        for i, (_, a) in enumerate(arrays):
            with open(os.path.join(folder, "test_data_set_0", f"{kind}_{i}.pb"), "wb") as f:
                # np.ascontiguousarray would make a 0-d array 1-D
                f.write(numpy_helper.from_array(np.array(a, order="C")).SerializeToString())


def onnx_gates(w, torch_order, onnx_order, hidden):
    """PyTorch stacks gates as i,f,g,o (LSTM) / r,z,n (GRU); ONNX as i,o,f,c / z,r,h."""
    parts = dict(zip(torch_order, torch.split(w, hidden, 0)))
    return torch.cat([parts[k] for k in onnx_order], 0)


def recurrent_weights(layer, kind, hidden, directions):
    order = {"LSTM": ("ifgo", "iofg"), "GRU": ("rzn", "zrn"), "RNN": ("i", "i")}[kind]
    ws, rs, bs = [], [], []
    for d in range(directions):
        sfx = "_l0" + ("_reverse" if d else "")
        g = lambda n: onnx_gates(getattr(layer, n + sfx).detach(), *order, hidden)
        ws.append(g("weight_ih"))
        rs.append(g("weight_hh"))
        bs.append(torch.cat([g("bias_ih"), g("bias_hh")]))
    return [torch.stack(t).numpy() for t in (ws, rs, bs)]


def recurrent_cases(root):
    torch.manual_seed(1)
    batch, seq, inp, hidden = 3, 5, 4, 6
    lens = torch.tensor([5, 2, 4])
    x = torch.randn(batch, seq, inp)
    pack = lambda t: torch.nn.utils.rnn.pack_padded_sequence(t, lens, batch_first=True, enforce_sorted=False)
    unpack = lambda p: torch.nn.utils.rnn.pad_packed_sequence(p, batch_first=True, total_length=seq)[0]

    # LSTM, both directions, layout 1 (batch first), sequence_lens and initial states
    lstm = torch.nn.LSTM(inp, hidden, bidirectional=True, batch_first=True)
    h0, c0 = torch.randn(2, batch, hidden), torch.randn(2, batch, hidden)
    with torch.no_grad():
        y, (h, c) = lstm(pack(x), (h0, c0))
    y = unpack(y).reshape(batch, seq, 2, hidden)
    w, r, b = recurrent_weights(lstm, "LSTM", hidden, 2)
    node = helper.make_node("LSTM", ["x", "w", "r", "b", "lens", "h0", "c0"], ["y", "yh", "yc"],
                            hidden_size=hidden, direction="bidirectional", layout=1)
    t = lambda a: a.transpose(0, 1).contiguous().numpy()
    write(root, "test_lstm_bidirectional_seq_lens_layout1", node, 14,
          [("x", x.numpy()), ("w", w), ("r", r), ("b", b), ("lens", lens.int().numpy()), ("h0", t(h0)), ("c0", t(c0))],
          [("y", y.numpy()), ("yh", t(h)), ("yc", t(c))])

    # GRU, both directions, layout 0, linear_before_reset = 1 (PyTorch's GRU), sequence_lens
    gru = torch.nn.GRU(inp, hidden, bidirectional=True)
    h0 = torch.randn(2, batch, hidden)
    with torch.no_grad():
        y, h = gru(pack(x), h0)
    y = unpack(y).reshape(batch, seq, 2, hidden).permute(1, 2, 0, 3).contiguous()
    w, r, b = recurrent_weights(gru, "GRU", hidden, 2)
    node = helper.make_node("GRU", ["x", "w", "r", "b", "lens", "h0"], ["y", "yh"],
                            hidden_size=hidden, direction="bidirectional", linear_before_reset=1)
    write(root, "test_gru_bidirectional_linear_before_reset", node, 14,
          [("x", x.transpose(0, 1).contiguous().numpy()), ("w", w), ("r", r), ("b", b), ("lens", lens.int().numpy()),
           ("h0", h0.numpy())],
          [("y", y.numpy()), ("yh", h.numpy())])

    # RNN with Relu, reverse direction: PyTorch's forward RNN over the time-reversed input
    rnn = torch.nn.RNN(inp, hidden, nonlinearity="relu")
    xs = x.transpose(0, 1).contiguous()
    with torch.no_grad():
        y, h = rnn(xs.flip(0))
    w, r, b = recurrent_weights(rnn, "RNN", hidden, 1)
    node = helper.make_node("RNN", ["x", "w", "r", "b"], ["y", "yh"], hidden_size=hidden, direction="reverse",
                            activations=["Relu"])
    write(root, "test_rnn_reverse_relu", node, 14, [("x", xs.numpy()), ("w", w), ("r", r), ("b", b)],
          [("y", y.flip(0).unsqueeze(1).numpy()), ("yh", h.numpy())])

    # LSTM with clip, input_forget and parameterised activations (no PyTorch equivalent): the
    # spec's equations in numpy
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.8, (1, 4 * hidden, inp)).astype(np.float32)
    r = rng.normal(0, 0.8, (1, 4 * hidden, hidden)).astype(np.float32)
    xs = xs.numpy()
    f = lambda v: np.clip(0.3 * v + 0.4, 0, 1)  # HardSigmoid(alpha 0.3, beta 0.4)
    g = lambda v: 1.5 * np.tanh(0.7 * v)  # ScaledTanh(alpha 1.5, beta 0.7)
    hh = lambda v: np.where(v >= 0, v, 0.2 * v)  # LeakyRelu(alpha 0.2)
    clip = 2.0
    h, c, ys = np.zeros((batch, hidden), np.float32), np.zeros((batch, hidden), np.float32), []
    for step in range(seq):
        pre = np.clip(xs[step] @ w[0].T + h @ r[0].T, -clip, clip)
        i, o, _, cc = np.split(pre, 4, axis=1)
        i = f(i)
        c = (1 - i) * c + i * g(cc)
        h = f(o) * hh(c)
        ys.append(h)
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y", "yh", "yc"], hidden_size=hidden, clip=clip,
                            input_forget=1, activations=["HardSigmoid", "ScaledTanh", "LeakyRelu"],
                            activation_alpha=[0.3, 1.5, 0.2], activation_beta=[0.4, 0.7])
    write(root, "test_lstm_clip_input_forget_activations", node, 14, [("x", xs), ("w", w), ("r", r)],
          [("y", np.stack(ys)[:, None].astype(np.float32)), ("yh", h[None].astype(np.float32)),
           ("yc", c[None].astype(np.float32))])


def signal_cases(root):
    """DFT at opset 20 (axis as an input, counted over the full rank) with a dft_length that pads
    and onesided output; numpy's FFT gives the expected values."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 12, 3, 1)).astype(np.float32)
    y = np.fft.rfft(x[..., 0].astype(np.float64), n=16, axis=1)
    node = helper.make_node("DFT", ["x", "n", "axis"], ["y"], onesided=1)
    write(root, "test_dft_opset20_axis_input_onesided_padded", node, 20,
          [("x", x), ("n", np.array(16, np.int64)), ("axis", np.array(-3, np.int64))],
          [("y", np.stack([y.real, y.imag], -1).astype(np.float32))])
    z = rng.standard_normal((1, 10, 2)).astype(np.float32)
    y = np.fft.ifft(z[..., 0] + 1j * z[..., 1], n=8, axis=1)  # truncated to 8, inverse
    node = helper.make_node("DFT", ["x", "n"], ["y"], axis=1, inverse=1)
    write(root, "test_dft_inverse_truncated", node, 17, [("x", z), ("n", np.array(8, np.int64))],
          [("y", np.stack([y.real, y.imag], -1).astype(np.float32))])


def sequence_cases(root):
    """SplitToSequence, SequenceErase, SequenceAt and ConcatFromSequence, which the installed test
    data has no cases for, chained between tensors; numpy slicing gives the expected values."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    nodes = [helper.make_node("SplitToSequence", ["x", "chunk"], ["s"], axis=0),  # rows 2, 2, 1
             helper.make_node("SequenceErase", ["s"], ["t"]),  # the last chunk
             helper.make_node("SequenceLength", ["t"], ["n"]),
             helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0)]
    write(root, "test_split_to_sequence_chunks_erase_concat", nodes, 11,
          [("x", x), ("chunk", np.array(2, np.int64))], [("y", x[:4]), ("n", np.array(2, np.int64))])
    x = rng.standard_normal((2, 6)).astype(np.float32)
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["s"], axis=1),
             helper.make_node("SequenceAt", ["s", "at"], ["y"]),
             helper.make_node("ConcatFromSequence", ["s"], ["z"], axis=-1)]
    write(root, "test_split_to_sequence_sizes_at_concat", nodes, 11,
          [("x", x), ("sizes", np.array([1, 2, 3], np.int64)), ("at", np.array(-2, np.int64))],
          [("y", x[:, 1:3]), ("z", x)])
    x = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1, keepdims=0),  # four [3] columns
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)]
    write(root, "test_split_to_sequence_keepdims0_stack", nodes, 11, [("x", x)], [("y", x.T.copy())])


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
    recurrent_cases(root)
    signal_cases(root)
    sequence_cases(root)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__))
