"""torch modules in, QAT in a Python loop, the original toolkit's YAML configs and module names.

References: the torch module itself (float outputs), torch's own fake-quantize operators
(gradients), and the `sparsebit` command on the same model, data and config (QAT losses,
exported models, YAML against its converted TOML).
"""

import itertools
import json
import os
import subprocess

import numpy as np
import onnx
from onnx import numpy_helper
import pytest
import torch
import torchvision

import sparsebit

ROOT = os.environ.get("SPARSEBIT_ROOT", os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("SPARSEBIT_BIN", os.path.join(ROOT, "build", "bin", "sparsebit"))

W8A8 = {
    "backend": "virtual",
    "w": {"qscheme": "per-channel-symmetric", "bits": 8, "observer": "minmax"},
    "a": {"qscheme": "per-tensor-affine", "bits": 8, "observer": "minmax"},
    "calibration": {"batch_size": 8},
}


def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


def images(count, size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, size, size, generator=g) for _ in range(count)]


def cosine(a, b):
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    return float((a @ b) / (a.norm() * b.norm()))


def run(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def test_a_torch_module_goes_in_and_torch_tensors_come_out():
    net = resnet18()
    qm = sparsebit.QuantModel(net, W8A8, example_inputs=torch.randn(1, 3, 64, 64))
    assert qm.inputs[0]["name"] == "x"  # the forward's parameter name
    assert qm.inputs[0]["shape"][0] == "batch"  # dynamic batch
    x = torch.stack(images(4, seed=1))
    y = qm(x, quantized=False)
    assert isinstance(y, torch.Tensor) and y.shape == (4, 10)
    with torch.no_grad():
        ref = net(x)
    assert torch.allclose(y, ref, atol=1e-4 * float(ref.abs().max())), float((y - ref).abs().max())
    qm.calibrate(images(32))
    yq = qm(x)
    assert isinstance(yq, torch.Tensor) and cosine(yq, ref) > 0.99
    assert net.training is False  # the module's mode is left as it was


def test_quantize_takes_a_module(tmp_path):
    net = torchvision.models.mobilenet_v3_small(num_classes=10).eval()
    out = tmp_path / "mobilenet_int8.onnx"
    report = sparsebit.quantize(net, W8A8, example_inputs=torch.randn(1, 3, 64, 64), calib=images(16),
                                output=str(out))
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) > 20
    assert report["quantized_inputs"]
    with pytest.raises(sparsebit.Error, match="example_inputs"):
        sparsebit.quantize(net, W8A8, calib=images(2), output=str(tmp_path / "x.onnx"))


def test_globs_name_torch_modules(tmp_path):
    net = resnet18()
    config = dict(W8A8, skip=["layer1*"], specific=[{"nodes": "fc", "w": {"bits": 4}},
                                                     {"nodes": "layer4.1.conv2", "a": {"bits": 4}}])
    qm = sparsebit.QuantModel(net, config, example_inputs=torch.randn(1, 3, 64, 64))
    slots = qm.report()["quantized_inputs"]
    layer1 = [s for s in slots if s["node"].startswith("/layer1/")]
    assert layer1 == []
    assert any(s["node"].startswith("/layer2/") for s in slots)
    fc_w = [s["bits"] for s in slots if s["node"] == "/fc/Gemm" and s["role"] == "weight"]
    assert fc_w == [4]
    conv = {s["role"]: s["bits"] for s in slots if s["node"] == "/layer4/layer4.1/conv2/Conv"}
    assert conv == {"activation": 4, "weight": 8}  # each side its own first match
    path = tmp_path / "resnet18.onnx"
    torch.onnx.export(net, torch.randn(1, 3, 64, 64), str(path), opset_version=13)
    nodes = json.loads(run("inspect", str(path), "--json").stdout)["node_list"]
    modules = {n["name"]: n["module"] for n in nodes}
    assert modules["/layer1/layer1.0/conv1/Conv"] == "layer1.0.conv1"
    assert modules["/fc/Gemm"] == "fc"
    assert "layer1.0.conv1" in run("inspect", str(path), "--nodes").stdout


# A config in the original toolkit's schema, written from its quant_config.py: weights and
# activations each with their own per-module overrides (torch.fx spelling for one of them).
QCONFIG_YAML = """\
BACKEND: virtual
SCHEDULE:
  FUSE_BN: True
W:
  QSCHEME: per-channel-symmetric
  QUANTIZER:
    TYPE: uniform
    BIT: 8
  OBSERVER:
    TYPE: MINMAX
  SPECIFIC: [{
    "fc": ["QUANTIZER.BIT", 4],
  }]
A:
  QSCHEME: per-tensor-affine
  QUANTIZER:
    TYPE: uniform
    BIT: 8
  OBSERVER:
    TYPE: PERCENTILE
    PERCENTILE:
      ALPHA: 0.01
    LAYOUT: NCHW
  SPECIFIC: [{
    "layer4_1_conv2": ["QUANTIZER.BIT", 4, "OBSERVER.TYPE", "MINMAX"],
    "layer1*": ["QUANTIZER.DISABLE", True],
  }]
"""


def test_original_yaml_configs_run_as_their_toml(tmp_path):
    net = resnet18()
    model = tmp_path / "resnet18.onnx"
    sparsebit._torch.export_module(net, torch.randn(1, 3, 64, 64), str(model))
    yaml = tmp_path / "qconfig.yaml"
    yaml.write_text(QCONFIG_YAML)
    toml = tmp_path / "qconfig.toml"
    run("config", "convert", str(yaml), "-o", str(toml))
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, x in enumerate(images(16)):
        np.save(calib / f"{i:03d}.npy", x.numpy())
    outs = {}
    for cfg in (yaml, toml):
        out = tmp_path / (cfg.suffix[1:] + ".onnx")
        run("quantize", str(model), "-c", str(cfg), "--calib", str(calib), "-o", str(out))
        outs[cfg.suffix] = out.read_bytes()
    assert outs[".yaml"] == outs[".toml"]
    # The same from Python, with the meanings of the original's keys.
    qm = sparsebit.QuantModel(str(model), str(yaml))
    slots = qm.report()["quantized_inputs"]
    bits = {(s["node"], s["role"]): s["bits"] for s in slots if s["enabled"]}
    assert bits[("/fc/Gemm", "weight")] == 4 and bits[("/fc/Gemm", "activation")] == 8
    assert bits[("/layer4/layer4.1/conv2/Conv", "activation")] == 4
    assert bits[("/layer4/layer4.1/conv2/Conv", "weight")] == 8
    assert not any(node.startswith("/layer1/") and role == "activation" for node, role in bits)
    # A round trip: the written TOML reads back to the same settings.
    again = tmp_path / "again.toml"
    again.write_text(toml.read_text())
    assert sparsebit.Config.from_file(str(again)) is not None


def test_yaml_keys_without_an_equivalent_are_refused(tmp_path):
    yaml = tmp_path / "q.yaml"
    yaml.write_text(QCONFIG_YAML.replace("  OBSERVER:\n    TYPE: PERCENTILE", "  QADD:\n    ENABLE_QUANT: True\n"
                                         "  OBSERVER:\n    TYPE: PERCENTILE"))
    r = subprocess.run([BIN, "config", "convert", str(yaml), "-o", str(tmp_path / "q.toml")], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "A.QADD.ENABLE_QUANT: not supported" in r.stderr
    assert not (tmp_path / "q.toml").exists()
    with pytest.raises(sparsebit.Error, match="A.QADD.ENABLE_QUANT"):
        sparsebit.Config.from_file(str(yaml))


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def small_cnn():
    torch.manual_seed(0)
    net = SmallCnn()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        net.features[1].running_mean.uniform_(-0.2, 0.2)
        net.features[1].running_var.uniform_(0.5, 2.0)
    return net.eval()


def samples(count, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(1, 16, 16, generator=g) for _ in range(count)]


LSQ = {
    "backend": "virtual",
    "w": {"qscheme": "per-channel-symmetric", "bits": 4, "observer": "minmax", "quantizer": "lsq"},
    "a": {"qscheme": "per-tensor-affine", "bits": 4, "observer": "minmax", "quantizer": "lsq_plus"},
    "calibration": {"batch_size": 16},
    "qat": {"epochs": 3, "lr": 1e-3, "batch_size": 8},
}


def test_a_python_qat_loop_equals_the_command(tmp_path):
    net = small_cnn()
    model = tmp_path / "cnn.onnx"
    sparsebit._torch.export_module(net, torch.randn(1, 1, 16, 16), str(model))
    calib, train = samples(32, seed=1), samples(32, seed=2)
    folders = {}
    for name, data in (("calib", calib), ("train", train)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for i, x in enumerate(data):
            np.save(folders[name] / f"{i:03d}.npy", x.numpy())
    config = tmp_path / "lsq.toml"
    config.write_text(toml_of(LSQ))
    run("qat", str(model), "-c", str(config), "--calib", str(folders["calib"]), "--train", str(folders["train"]),
        "-o", str(tmp_path / "command.onnx"), "--report", str(tmp_path / "command.json"))
    command_losses = [e["loss"] for e in json.loads((tmp_path / "command.json").read_text())["qat"]["epochs"]]

    # The same run as a user's loop: the float module is the teacher, Adam on parameters().
    qm = sparsebit.QuantModel(str(model), str(config))
    qm.init_qat(calib)
    assert qm.training
    params = qm.parameters()
    names = [n for n, _ in qm.named_parameters()]
    assert any(n.startswith("weight ") for n in names) and any(n.startswith("quantizer ") for n in names)
    assert all(p.requires_grad and p.is_leaf for p in params)
    optimizer = torch.optim.Adam(params, lr=LSQ["qat"]["lr"])
    batches = [torch.stack(train[i:i + 8]) for i in range(0, len(train), 8)]
    losses = []
    for _ in range(LSQ["qat"]["epochs"]):
        total = 0.0
        for x in batches:
            with torch.no_grad():
                target = net(x)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(qm(x), target)
            loss.backward()
            optimizer.step()
            total += float(loss)
        losses.append(total / len(batches))
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, command_losses, rtol=2e-4)
    qm.eval()
    qm.export(str(tmp_path / "python.onnx"))
    a = onnx.load(str(tmp_path / "python.onnx"))
    b = onnx.load(str(tmp_path / "command.onnx"))
    assert [(n.op_type, list(n.input)) for n in a.graph.node] == [(n.op_type, list(n.input)) for n in b.graph.node]
    inits_b = {t.name: t for t in b.graph.initializer}
    assert sorted(inits_b) == sorted(t.name for t in a.graph.initializer)
    for t in a.graph.initializer:
        u = inits_b[t.name]
        assert (t.data_type, list(t.dims)) == (u.data_type, list(u.dims)), t.name
        if t.data_type == onnx.TensorProto.FLOAT:  # trained floats: scales, biases
            np.testing.assert_allclose(numpy_helper.to_array(t), numpy_helper.to_array(u), rtol=1e-3, atol=1e-6,
                                       err_msg=t.name)
        else:  # integer weights (INT4 packed): the same grid points
            assert t.raw_data == u.raw_data, t.name


def toml_of(config):
    lines = []
    for key, value in config.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
        else:
            lines.insert(0, f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


class OneConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)


def test_gradients_equal_torch_fake_quant():
    torch.manual_seed(0)
    net = OneConv().eval()
    config = {
        "backend": "virtual",
        "w": {"qscheme": "per-channel-symmetric", "bits": 4, "observer": "minmax", "quantizer": "lsq"},
        "a": {"qscheme": "per-tensor-affine", "bits": 4, "observer": "minmax", "quantizer": "lsq"},
    }
    qm = sparsebit.QuantModel(net, config, example_inputs=torch.randn(1, 3, 8, 8))
    calib = [torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    qm.init_qat(calib)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(99))
    named = dict(qm.named_parameters())
    slots = {s["role"]: s for s in qm.report()["quantized_inputs"] if s["node"] == "/conv/Conv"}
    weight, bias = named["weight conv.weight"], named["weight conv.bias"]
    w_scale, a_scale = named["quantizer /conv/Conv#1/0"], named["quantizer /conv/Conv#0/0"]
    # Wider ranges than calibrated, so no value is clipped or halfway between two grid points:
    # torch rounds before it clips (the paper clips first) and multiplies by 1 / scale (we
    # divide), which only differ there.
    with torch.no_grad():
        w_scale.mul_(1.1)
        a_scale.mul_(1.71)
    a_zp = torch.tensor(slots["activation"]["zero_point"], dtype=torch.float32).reshape(-1)
    for v, lo, hi in ((x / a_scale + a_zp, 0, 15), (weight / w_scale.reshape(-1, 1, 1, 1), -8, 7)):
        v = v.detach()
        assert float(v.min()) > lo and float(v.max()) < hi
        assert float(((v - v.floor()) - 0.5).abs().min()) > 1e-4
    (qm(x) ** 2).mean().backward()

    # torch's learnable fake quantizers with LSQ's gradient scale 1 / sqrt(N * qmax).
    w = weight.detach().clone().requires_grad_(True)
    sw = w_scale.detach().clone().reshape(-1).requires_grad_(True)
    sa = a_scale.detach().clone().reshape(-1).requires_grad_(True)
    b = bias.detach().clone().requires_grad_(True)
    assert slots["activation"]["bits"] == 4 and slots["weight"]["bits"] == 4
    qa = (slots["activation"]["qmin"], slots["activation"]["qmax"])
    qw = (slots["weight"]["qmin"], slots["weight"]["qmax"])
    xq = torch._fake_quantize_learnable_per_tensor_affine(x, sa, a_zp, qa[0], qa[1],
                                                           1.0 / np.sqrt(x.numel() * qa[1]))
    wq = torch._fake_quantize_learnable_per_channel_affine(w, sw, torch.zeros(4), 0, qw[0], qw[1],
                                                            1.0 / np.sqrt(w[0].numel() * qw[1]))
    (torch.nn.functional.conv2d(xq, wq, b) ** 2).mean().backward()
    torch.testing.assert_close(weight.grad, w.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(bias.grad, b.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(w_scale.grad.reshape(-1), sw.grad, rtol=1e-3, atol=1e-7)
    torch.testing.assert_close(a_scale.grad.reshape(-1), sa.grad, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("quantizer", ["uniform", "lsq", "lsq_plus", "pact_dorefa"])
def test_every_training_quantizer_passes_gradients(quantizer):
    net = small_cnn()
    config = {
        "backend": "virtual",
        # DoReFa is a weight quantizer and PACT an activation one: each beside the other.
        "w": {"qscheme": "per-channel-symmetric", "bits": 4, "observer": "minmax",
              "quantizer": "dorefa" if quantizer == "pact_dorefa" else quantizer},
        "a": {"qscheme": "per-tensor-affine", "bits": 4, "observer": "minmax",
              "quantizer": "pact" if quantizer == "pact_dorefa" else quantizer},
    }
    qm = sparsebit.QuantModel(net, config, example_inputs=torch.randn(1, 1, 16, 16))
    qm.init_qat(samples(16, seed=1))
    x = torch.stack(samples(8, seed=2))
    with torch.no_grad():
        target = net(x)
    optimizer = torch.optim.SGD(qm.parameters(), lr=1e-2)
    loss = torch.nn.functional.mse_loss(qm(x), target)
    loss.backward()
    for name, p in qm.named_parameters():
        if name.startswith("weight "):
            assert p.grad is not None and float(p.grad.abs().sum()) > 0, name
    optimizer.step()
    with torch.no_grad():
        y = qm(x)
    assert y.grad_fn is None  # no graph under no_grad
    assert torch.isfinite(y).all()


def test_training_without_init_qat_is_refused():
    qm = sparsebit.QuantModel(OneConv().eval(), W8A8, example_inputs=torch.randn(1, 3, 8, 8))
    with pytest.raises(sparsebit.Error, match="init_qat"):
        qm.parameters()


def test_calibrate_then_init_qat_without_data_as_the_original_toolkit():
    # The original toolkit's calibrate(...) then init_QAT(): QAT starts from that calibration, the
    # same start as init_qat(data) gives.
    net = small_cnn()
    config = {"backend": "virtual", "w": {"bits": 4, "quantizer": "lsq"}, "a": {"bits": 4, "quantizer": "lsq"}}
    qm = sparsebit.QuantModel(net, config, example_inputs=torch.randn(1, 1, 16, 16))
    with pytest.raises(sparsebit.Error, match=r"calibrate\(\) first"):
        qm.init_qat()
    qm.calibrate(samples(16, seed=1))
    qm.init_qat()
    reference = sparsebit.QuantModel(net, config, example_inputs=torch.randn(1, 1, 16, 16))
    reference.init_qat(samples(16, seed=1))
    ours, theirs = qm.named_parameters(), reference.named_parameters()
    assert [n for n, _ in ours] == [n for n, _ in theirs] and len(ours) > 0
    for (name, a), (_, b) in zip(ours, theirs):
        assert torch.equal(a, b), name
    x = torch.stack(samples(8, seed=2))
    loss = qm(x).square().mean()
    loss.backward()
    assert all(p.grad is not None for _, p in ours if _.startswith("weight "))


def test_export_of_nan_parameters_is_refused(tmp_path):
    # A parameter that training (or the user) filled with NaN would export as saturated integers.
    net = small_cnn()
    qm = sparsebit.QuantModel(net, {"backend": "virtual", "w": {"quantizer": "lsq"}, "a": {"quantizer": "lsq"}},
                              example_inputs=torch.randn(1, 1, 16, 16))
    qm.init_qat(samples(16, seed=1))
    name, p = next((n, p) for n, p in qm.named_parameters() if n.startswith("weight "))
    with torch.no_grad():
        p.fill_(float("nan"))
    with pytest.raises(sparsebit.Error, match="NaN or infinite"):
        qm.export(str(tmp_path / "q.onnx"))
    assert not (tmp_path / "q.onnx").exists()


def test_bit_allocation_is_the_best_choice_under_the_budget(tmp_path):
    net = small_cnn()
    config = dict(W8A8, bit_allocation={"avg_weight_bits": 6, "avg_activation_bits": 6, "choices": [4, 8],
                                        "samples": 16})
    qm = sparsebit.QuantModel(net, config, example_inputs=torch.randn(1, 1, 16, 16))
    calib = samples(32, seed=1)
    qm.calibrate(calib)
    report = qm.report()
    alloc = report["bit_allocation"]
    bits = {(s["node"], s["role"]): s["bits"] for s in report["quantized_inputs"]}
    for role, target, key in (("weight", 6, "avg_weight_bits"), ("activation", 6, "avg_activation_bits")):
        inputs = [i for i in alloc["inputs"] if i["role"] == role]
        assert len(inputs) == 3  # the two convolutions and the linear layer
        for i in inputs:
            assert bits[(i["node"], role)] == i["bits"] in (4, 8)
        cost = sum(i["cost"] for i in inputs)
        reached = sum(i["cost"] * i["bits"] for i in inputs) / cost
        assert reached <= target + 1e-9 and abs(reached - alloc[key]) < 1e-9
        # Every assignment under the budget, by brute force: none adds less measured error.
        best = min(
            (sum(i["relative_error"][str(b)] for i, b in zip(inputs, choice)), choice)
            for choice in itertools.product((4, 8), repeat=len(inputs))
            if sum(i["cost"] * b for i, b in zip(inputs, choice)) <= target * cost
        )
        chosen = sum(i["relative_error"][str(i["bits"])] for i in inputs)
        assert chosen <= best[0] * (1 + 1e-9), (chosen, best)
        assert any(i["bits"] == 4 for i in inputs) and any(i["bits"] == 8 for i in inputs)
    # The widths are exported: the 4-bit tensors are listed in the model's metadata.
    qm.export(str(tmp_path / "mixed.onnx"))
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "mixed.onnx")).metadata_props}
    narrow = json.loads(meta["sparsebit.bits"])
    four = {i["tensor"] for i in alloc["inputs"] if i["bits"] == 4}
    assert four and all(narrow.get(t) == 4 for t in four if t in narrow) and len(four & set(narrow)) > 0


QAT_YAML = """\
BACKEND: virtual
W:
  QSCHEME: per-channel-symmetric
  QUANTIZER: {TYPE: lsq, BIT: 4}
A:
  QSCHEME: per-tensor-affine
  QUANTIZER: {TYPE: lsq+, BIT: 4}
  SPECIFIC: [{"head": ["QUANTIZER.BIT", 8]}]
"""


def test_the_original_workflow_end_to_end(tmp_path):
    """docs/PYTHON.md's workflow: a module, a YAML config, calibration by forward passes, QAT in
    a torch loop, export."""
    net = small_cnn()
    yaml = tmp_path / "qconfig.yaml"
    yaml.write_text(QAT_YAML)
    batches = [torch.stack(samples(8, seed=s)) for s in range(4)]
    qmodel = sparsebit.QuantModel(net, str(yaml), example_inputs=batches[0][:1])
    qmodel.prepare_calibration()
    with torch.no_grad():
        for x in batches:
            assert torch.allclose(qmodel(x), net(x), atol=1e-5)  # float while collecting
    qmodel.calc_qparams()
    # The same as calibrate() on the same batches.
    reference = sparsebit.QuantModel(net, str(yaml), example_inputs=batches[0][:1])
    reference.calibrate(batches)
    assert scales_of(qmodel) == scales_of(reference)
    head = [s for s in qmodel.report()["quantized_inputs"] if s["node"] == "/head/Gemm"]
    assert {s["role"]: s["bits"] for s in head} == {"activation": 8, "weight": 4}

    qmodel.init_QAT()
    optimizer = torch.optim.Adam(qmodel.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        for x in batches:
            optimizer.zero_grad()
            with torch.no_grad():
                target = net(x)
            loss = torch.nn.functional.mse_loss(qmodel(x), target)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    qmodel.eval()
    qmodel.export_onnx(batches[0][:1], name=str(tmp_path / "qmodel.onnx"))
    exported = onnx.load(str(tmp_path / "qmodel.onnx"))  # INT4 at opset 21: newer than this onnx's checker
    assert sum(n.op_type == "DequantizeLinear" for n in exported.graph.node) >= 6


def scales_of(qm):
    return {(s["node"], s["input_index"]): s.get("scale") for s in qm.report()["quantized_inputs"]}
