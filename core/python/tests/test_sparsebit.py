"""The Python package against the `sparsebit` command and against numpy references.

Run by ctest (python.pytest) with PYTHONPATH at build/python, SPARSEBIT_BIN at the command
and SPARSEBIT_ROOT at the source tree.
"""

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparsebit

ROOT = os.environ.get("SPARSEBIT_ROOT", os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("SPARSEBIT_BIN", os.path.join(ROOT, "build", "bin", "sparsebit"))
CNN = os.path.join(ROOT, "examples", "fashion_mnist", "fashion_mnist_cnn.onnx")
MOBILENET = os.path.join(ROOT, "examples", "fashion_mnist", "fashion_mnist_mobilenet.onnx")
W8A8 = os.path.join(ROOT, "configs", "w8a8_onnxruntime_reduce_range.toml")
# Layers too small for ONNX Runtime's integer kernels to pay stay float under the onnxruntime
# backend (Note [ONNX Runtime placement]); the simulation backend quantizes them as the roles say.
SIMULATED = {"backend": "virtual", "w": {"bits": 8}, "a": {"bits": 8}}
IMAGES = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def fashion_images(count):
    """The first `count` training images as the command's IDX reader gives them: uint8 / 255."""
    with gzip.open(IMAGES, "rb") as f:
        header = np.frombuffer(f.read(16), dtype=">u4")
        n, rows, cols = int(header[1]), int(header[2]), int(header[3])
        raw = np.frombuffer(f.read(min(count, n) * rows * cols), dtype=np.uint8)
    return (raw.reshape(-1, 1, rows, cols).astype(np.float32) / np.float32(255)).astype(np.float32)


@pytest.fixture(scope="module")
def images():
    return fashion_images(512)


def scales(report):
    return {(s["node"], s["input_index"]): (s.get("scale"), s.get("zero_point")) for s in report["quantized_inputs"]}


def two_input_model(path):
    """y = a @ Wa + b @ Wb, a [N, 4], b [N, 8]: a model fed by name."""
    rng = np.random.default_rng(0)
    wa = rng.standard_normal((4, 6)).astype(np.float32)
    wb = rng.standard_normal((8, 6)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["a", "Wa"], ["pa"], name="mm_a"),
        helper.make_node("MatMul", ["b", "Wb"], ["pb"], name="mm_b"),
        helper.make_node("Add", ["pa", "pb"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
        [numpy_helper.from_array(wa, "Wa"), numpy_helper.from_array(wb, "Wb")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, path)
    return wa, wb


def test_same_scales_and_bytes_as_the_command(tmp_path, images):
    cli_out = tmp_path / "cli.onnx"
    subprocess.run(
        # --no-latency: the command's latency search (Note [Latency search]) keeps a region float
        # where ONNX Runtime times it faster so, a choice that follows the machine's load; the
        # Python QuantModel exports without it.
        [BIN, "--quiet", "quantize", CNN, "-c", W8A8, "--calib", IMAGES, "--calib-count", "512",
         "-o", str(cli_out), "--report", str(tmp_path / "cli.json"), "--no-latency"],
        check=True,
    )
    cli_report = json.load(open(tmp_path / "cli.json"))

    qm = sparsebit.QuantModel(sparsebit.load(CNN), sparsebit.Config.from_file(W8A8))
    seen = []
    stats = qm.calibrate((x for x in images), progress=lambda done, total: seen.append(done))
    assert stats["samples"] == 512
    assert seen and seen[-1] == 512 and seen == sorted(seen)
    py_out = tmp_path / "py.onnx"
    qm.export(py_out)

    assert scales(qm.report()) == scales(cli_report)
    assert py_out.read_bytes() == cli_out.read_bytes()


def write_bn_model(path, rng):
    """Conv -> BatchNormalization -> Relu -> Conv -> Flatten -> Gemm, its BN statistics off from
    what the data gives (so re-estimating them changes the model), 8 channels (so pruning has
    some to remove)."""
    w1 = rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32)
    wf = rng.normal(0, 0.2, (8 * 6 * 6, 5)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.normal(0, 1.0, 8).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.2, 3.0, 8).astype(np.float32), "var"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(wf, "wf"),
        numpy_helper.from_array(np.array([0, -1], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Reshape", ["r2", "flat"], ["f"]),
        helper.make_node("MatMul", ["f", "wf"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def bn_model_and_calib(tmp_path):
    """write_bn_model's model and 16 calibration samples for it, in tmp_path."""
    rng = np.random.default_rng(7)
    model = str(tmp_path / "bn.onnx")
    write_bn_model(model, rng)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(16):
        np.save(calib / f"{i:02d}.npy", rng.normal(0.5, 1.0, (1, 3, 8, 8)).astype(np.float32))
    return model, calib


@pytest.mark.parametrize("extra", ["[schedule]\nbn_tuning = true\n",
                                   "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n"])
def test_every_host_prepares_the_model_as_the_command_does(tmp_path, extra):
    # Note [One preparation for every host]: BN re-estimation and pruning happen in the Python
    # QuantModel and in `profile` as in `quantize`: the same model bytes and the same profile.
    model, calib = bn_model_and_calib(tmp_path)
    # Without the latency search: a timing choice of the command that a QuantModel does not make.
    base = open(os.path.join(ROOT, "configs", "w8a8_onnxruntime.toml")).read() + "\n[latency]\nsearch = false\n"
    config = tmp_path / "prepared.toml"
    config.write_text(base + "\n" + extra)
    plain = tmp_path / "plain.toml"
    plain.write_text(base)
    out = {}
    for name, cfg in (("cli", config), ("plain", plain)):
        out[name] = tmp_path / f"{name}.onnx"
        subprocess.run([BIN, "--quiet", "quantize", model, "-c", str(cfg), "--calib", str(calib), "-o", str(out[name])],
                       check=True)
        subprocess.run([BIN, "--quiet", "profile", model, "-c", str(cfg), "--calib", str(calib), "--samples", "8",
                        "-o", str(tmp_path / f"{name}_profile")], check=True, stdout=subprocess.DEVNULL)
    assert out["cli"].read_bytes() != out["plain"].read_bytes()  # the step changes the model

    qm = sparsebit.QuantModel(model, str(config), calib=str(calib))
    qm.calibrate(str(calib))
    qm.export(tmp_path / "py.onnx")
    assert (tmp_path / "py.onnx").read_bytes() == out["cli"].read_bytes()
    py_profile = sparsebit.profile(qm, str(calib), samples=8)
    cli_profile = json.load(open(tmp_path / "cli_profile.json"))
    plain_profile = json.load(open(tmp_path / "plain_profile.json"))
    assert py_profile == cli_profile
    assert cli_profile != plain_profile


def test_qat_trains_the_model_the_config_prepares(tmp_path):
    # `sparsebit qat` prunes with [sparse] before training (it quantized the unpruned model).
    model, calib = bn_model_and_calib(tmp_path)
    config = tmp_path / "sp.toml"
    config.write_text(open(os.path.join(ROOT, "configs", "w8a8_onnxruntime.toml")).read()
                      + '\n[sparse]\nsparser = "l1_structured"\nratio = 0.5\n[qat]\nepochs = 1\nbatch_size = 8\n')
    out = tmp_path / "qat.onnx"
    subprocess.run([BIN, "--quiet", "qat", model, "-c", str(config), "--calib", str(calib), "--train", str(calib),
                    "-o", str(out)], check=True)
    conv_weights = [list(t.dims) for t in onnx.load(str(out)).graph.initializer
                    if t.name.endswith("_quantized") and len(t.dims) == 4]
    assert sorted(conv_weights) == [[4, 3, 3, 3], [4, 4, 3, 3]]  # each Conv kept 4 of its 8 channels


def test_bn_tuning_without_data_names_the_fix(tmp_path):
    model = str(tmp_path / "bn.onnx")
    write_bn_model(model, np.random.default_rng(7))
    config = tmp_path / "bn.toml"
    config.write_text(open(os.path.join(ROOT, "configs", "w8a8_onnxruntime.toml")).read()
                      + "\n[schedule]\nbn_tuning = true\n")
    with pytest.raises(sparsebit.Error, match=r"bn_tuning re-estimates the statistics of 1 BatchNormalization.*"
                                               r"pass calibration data \(--calib; calib= in Python\)"):
        sparsebit.QuantModel(model, str(config))


def test_forward_is_the_simulated_model(images):
    qm = sparsebit.QuantModel(CNN, W8A8)  # paths work where objects do
    qm.calibrate([images[i : i + 64] for i in range(0, 512, 64)])  # batches: a list of [64, 1, 28, 28]
    x = images[:16]
    fp = qm.forward(x, quantized=False)
    q = qm.forward(x)
    assert fp.shape == (16, 10) and fp.dtype == np.float32
    # The simulated model is close to the float one, but not equal to it.
    assert 0 < np.abs(q - fp).max() < 0.1 * np.abs(fp).max()
    assert (q.argmax(1) == fp.argmax(1)).mean() >= 0.9
    # Outputs are numpy views of the result, not copies.
    assert not q.flags.owndata and q.flags.c_contiguous
    # Other layouts and dtypes are converted once and give the same numbers.
    assert np.array_equal(qm.forward(np.asfortranarray(x)), q)
    assert np.array_equal(qm.forward(x.astype(np.float64)), q)
    # A dict by name; a name the model lacks is refused with the names it has.
    with pytest.raises(sparsebit.Error, match=r"'nope' is not an input of the model \(its inputs: '"):
        qm.forward({"nope": x})
    # A shape the model does not declare is refused, as a runtime refuses it.
    with pytest.raises(sparsebit.Error, match=r"has shape \[2, 1, 27, 28\], the model declares \[.*, 1, 28, 28\]"):
        qm.forward(np.zeros((2, 1, 27, 28), np.float32))
    with pytest.raises(sparsebit.Error, match=r"has shape \[2, 28, 28\]"):
        qm.forward(np.zeros((2, 28, 28), np.float32))


def test_memory_limit_refuses_the_node_that_would_pass_it(images):
    qm = sparsebit.QuantModel(CNN, W8A8)
    qm.calibrate(images[:64])
    default = sparsebit.memory_limit()
    assert default > 0
    expected = qm.forward(images[:512])  # activations of tens of MiB
    try:
        sparsebit.set_memory_limit("2MiB")
        assert sparsebit.memory_limit() == 2 << 20
        with pytest.raises(sparsebit.Error, match=r"node '[^']+' \(\w+\) on inputs of shapes .* memory limit of 2\.0 MiB"):
            qm.forward(images[:512])
    finally:
        sparsebit.set_memory_limit(None)
    assert sparsebit.memory_limit() == default
    np.testing.assert_array_equal(qm.forward(images[:512]), expected)  # nothing left half-done
    with pytest.raises(sparsebit.Error, match="'lots' is not a memory size"):
        sparsebit.set_memory_limit("lots")
    with pytest.raises(sparsebit.Error, match="less than 1 MiB"):
        sparsebit.set_memory_limit(1000)


def test_torch_tensors_come_in_through_dlpack(images):
    torch = pytest.importorskip("torch")
    a = sparsebit.QuantModel(CNN, W8A8)
    a.calibrate(images[:128])
    b = sparsebit.QuantModel(CNN, W8A8)
    b.calibrate(torch.from_numpy(images[:128]).requires_grad_())  # a tensor that requires grad too
    assert scales(a.report()) == scales(b.report())
    np.testing.assert_array_equal(b.forward(torch.from_numpy(images[:4])), a.forward(images[:4]))


def test_dict_inputs_of_a_two_input_model(tmp_path):
    path = str(tmp_path / "two.onnx")
    wa, wb = two_input_model(path)
    model = sparsebit.load(path)
    assert [i["name"] for i in model.inputs] == ["a", "b"]
    assert model.inputs[0]["shape"] == ["n", 4] and model.inputs[0]["type"] == "float"
    assert model.op_histogram() == {"MatMul": 2, "Add": 1}
    rng = np.random.default_rng(1)
    data = [{"a": rng.standard_normal((8, 4)).astype(np.float32),
             "b": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    # The simulation backend: the onnxruntime backend keeps layers this small in float (their
    # Q/DQ would cost ONNX Runtime more than their integer kernels save).
    config = {"backend": "virtual",
              "w": {"qscheme": "per-channel-symmetric", "bits": 8},
              "a": {"qscheme": "per-tensor-affine", "bits": 8}}
    by_name = sparsebit.QuantModel(model, sparsebit.Config(config))
    by_name.calibrate(data)
    in_order = sparsebit.QuantModel(model, config)
    in_order.calibrate([(d["a"], d["b"]) for d in data])
    assert scales(by_name.report()) == scales(in_order.report())

    x = data[0]
    expected = x["a"] @ wa + x["b"] @ wb
    np.testing.assert_allclose(by_name.forward(x, quantized=False), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(by_name.forward(x["a"], x["b"], quantized=False), expected, rtol=1e-5, atol=1e-5)
    q = by_name.forward(x)
    assert 0 < np.abs(q - expected).max() < 0.05 * np.abs(expected).max()
    # The activation scale of input `a` is its calibration range over 255 (affine uint8).
    everything = np.concatenate([d["a"] for d in data])
    scale = scales(by_name.report())[("mm_a", 0)][0][0]
    lo, hi = min(everything.min(), 0), max(everything.max(), 0)
    assert scale == pytest.approx((hi - lo) / 255, rel=1e-6)


def test_config_dicts_take_every_toml_shape(images):
    config = sparsebit.Config({
        "backend": "virtual",
        "w": {"qscheme": "per-channel-symmetric", "bits": np.int64(4)},  # numpy scalars too
        "a": {"qscheme": "per-tensor-affine", "observer": "percentile",
              "observer_options": {"alpha": np.float32(1e-3)}},
        "specific": [{"nodes": ["/conv1/Conv"], "w": {"bits": 8}}],  # [[specific]]
    })
    qm = sparsebit.QuantModel(CNN, config)
    qm.calibrate(images[:32])
    bits = {s["node"]: s["bits"] for s in qm.report()["quantized_inputs"] if s["role"] == "weight"}
    assert bits["/conv1/Conv"] == 8 and bits["/conv2/Conv"] == 4


def test_one_dict_is_one_item(tmp_path):
    path = str(tmp_path / "two.onnx")
    two_input_model(path)
    qm = sparsebit.QuantModel(path, SIMULATED)
    stats = qm.calibrate({"a": np.ones((3, 4), np.float32), "b": np.ones((3, 8), np.float32)})
    assert stats["samples"] == 3


def test_bad_inputs_raise_sparsebit_error(tmp_path, images):
    assert issubclass(sparsebit.Error, RuntimeError)
    qm = sparsebit.QuantModel(CNN, W8A8)
    with pytest.raises(sparsebit.Error, match="complex"):
        qm.calibrate([images[:4].astype(np.complex64)])
    with pytest.raises(sparsebit.Error, match="not numeric"):
        qm.calibrate([np.array([object()] * 4, dtype=object)])
    with pytest.raises(sparsebit.Error, match="not numeric"):
        qm.calibrate([np.full((4, 1, 28, 28), "x")])
    with pytest.raises(sparsebit.Error, match="28"):
        qm.calibrate([np.zeros((4, 1, 27, 28), np.float32)])
    with pytest.raises(sparsebit.Error, match="yield the inputs only"):
        qm.calibrate([(images[:4], np.zeros(4))])  # (x, label) pairs from a loader
    path = str(tmp_path / "two.onnx")
    two_input_model(path)
    two = sparsebit.QuantModel(path, SIMULATED)  # the onnxruntime backend keeps its layers float
    with pytest.raises(sparsebit.Error, match="no value for the model input 'b'"):
        two.calibrate([{"a": np.zeros((2, 4), np.float32)}])
    with pytest.raises(sparsebit.Error, match="did you mean 'b'"):
        two.calibrate([{"a": np.zeros((2, 4), np.float32), "bb": np.zeros((2, 8), np.float32)}])
    with pytest.raises(sparsebit.Error, match="did you mean"):
        sparsebit.Config({"a": {"obsever": "minmax"}})
    with pytest.raises(sparsebit.Error, match="no TOML equivalent"):
        sparsebit.Config({"a": {"bits": None}})
    with pytest.raises(sparsebit.Error, match="calibrate"):
        sparsebit.QuantModel(CNN, W8A8).export(tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def test_version_is_the_commands():
    cli = subprocess.run([BIN, "--version"], capture_output=True, text=True)
    assert sparsebit.__version__ and sparsebit.__version__ in cli.stdout + cli.stderr


def test_other_modules_errors_stay_theirs():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as raised:
        torch.zeros(2) + torch.zeros(3)
    assert not isinstance(raised.value, sparsebit.Error) and "size of tensor" in str(raised.value)


def test_errors_carry_the_message_the_command_prints(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text('backend = "onnxruntime"\n[a]\nobsever = "minmax"\n')
    cli = subprocess.run([BIN, "quantize", CNN, "-c", str(bad), "--calib", IMAGES, "-o", str(tmp_path / "o.onnx")],
                         capture_output=True, text=True)
    assert cli.returncode == 1
    with pytest.raises(sparsebit.Error) as raised:
        sparsebit.Config.from_file(bad)
    assert str(raised.value) and str(raised.value) in cli.stderr


def test_ctrl_c_during_calibration_leaves_no_file(tmp_path, images):
    out = tmp_path / "model.onnx"

    def interrupted():
        for i, x in enumerate(images):
            if i == 100:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C does
            yield x

    with pytest.raises(KeyboardInterrupt):
        sparsebit.quantize(CNN, W8A8, calib=interrupted, output=out, report=tmp_path / "r.json")
    assert os.listdir(tmp_path) == []


def test_ctrl_c_during_training_leaves_no_model(tmp_path, images):
    data = [images[i : i + 32] for i in range(0, 128, 32)]
    ckpt = tmp_path / "qat.ckpt"

    def train():
        for i, x in enumerate(data):
            if ckpt.exists() and i == 2:  # in the second epoch
                os.kill(os.getpid(), signal.SIGINT)
            yield x

    with pytest.raises(KeyboardInterrupt):
        sparsebit.qat(CNN, os.path.join(ROOT, "configs", "w4a4_lsq.toml"), calib=data, train=train,
                      output=tmp_path / "qat.onnx", epochs=3, checkpoint=ckpt)
    # The first epoch's checkpoint stays (a later run resumes from it); no model, no temporary.
    assert sorted(os.listdir(tmp_path)) == ["qat.ckpt"]


def test_a_python_exception_in_the_data_arrives_as_itself(images):
    def broken():
        yield images[0]
        raise ValueError("the user's loader failed")

    with pytest.raises(ValueError, match="loader failed"):
        sparsebit.QuantModel(CNN, W8A8).calibrate(broken())


def test_the_gil_is_released_during_calibration(images):
    qm = sparsebit.QuantModel(MOBILENET, W8A8)
    batch = np.concatenate([images, images])  # one item: C++ holds no GIL between samples
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.002)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.05)
    start = time.monotonic()
    qm.calibrate([batch])
    end = time.monotonic()
    stop.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # The thread ran all along: with the GIL held it would tick only at the data callbacks.
    assert end - start > 0.1
    assert len(during) >= 0.25 * (end - start) / 0.002


def test_one_quant_model_runs_one_call_at_a_time(images):
    qm = sparsebit.QuantModel(CNN, W8A8)
    errors = []
    started = threading.Event()

    def slow():
        for x in images:
            started.set()
            time.sleep(0.001)
            yield x

    t = threading.Thread(target=lambda: qm.calibrate(slow()))
    t.start()
    started.wait()
    try:
        qm.calibrate(images[:8])
    except sparsebit.Error as e:
        errors.append(str(e))
    t.join()
    assert errors and "another thread" in errors[0]
    qm.forward(images[:2])  # usable again once the first call ended


def test_one_shot_generators_are_refused_where_data_is_read_twice(tmp_path, images):
    gen = (x for x in images[:64])
    with pytest.raises(sparsebit.Error, match="one-shot iterator"):
        sparsebit.quantize(CNN, W8A8, calib=gen, output=tmp_path / "o.onnx", target="cosine>=0.9")
    # A function returning a new generator can be read as often as a step needs.
    report = sparsebit.quantize(CNN, W8A8, calib=lambda: (x for x in images[:64]), output=tmp_path / "o.onnx",
                                target="cosine>=0.9")
    assert report["target"]["target"] == "cosine>=0.9"
    assert (tmp_path / "o.onnx").exists()


def test_set_bits_and_set_enabled(images):
    config = {"backend": "virtual", "w": {"qscheme": "per-channel-symmetric"}, "a": {"qscheme": "per-tensor-affine"}}
    qm = sparsebit.QuantModel(CNN, config)
    assert qm.set_enabled("*", False, role="activation") > 0
    assert qm.set_bits("/conv1/*", 4, role="weight") == 1
    qm.calibrate(images[:64])
    slots = qm.report()["quantized_inputs"]
    assert all(not s["enabled"] for s in slots if s["role"] == "activation")
    conv1 = [s for s in slots if s["node"] == "/conv1/Conv" and s["role"] == "weight"]
    assert conv1 and conv1[0]["bits"] == 4
    with pytest.raises(sparsebit.Error, match="role"):
        qm.set_bits("*", 8, role="weights")
    # The config's globs and these are one language: one it refuses is refused here too.
    with pytest.raises(sparsebit.Error, match="never closed"):
        qm.set_bits("[", 8)


def test_profile_prune_qat_and_plugins(tmp_path, images):
    listed = sparsebit.plugins()
    assert all({"name", "file", "status", "version", "registered"} <= set(p) for p in listed)
    registered = " ".join(r for p in listed if p["status"] == "loaded" for r in p["registered"])
    assert "onnxruntime" in registered and "minmax" in registered and "Conv" in registered

    qm = sparsebit.QuantModel(CNN, W8A8)
    qm.calibrate(images[:128])
    prof = sparsebit.profile(qm, images[:8], samples=8, mode="single", output=tmp_path / "prof")
    assert prof["samples"] == 8 and len(prof["single"]) > 0
    assert (tmp_path / "prof.json").exists() and (tmp_path / "prof.html").exists()

    pruned = sparsebit.prune(CNN, os.path.join(ROOT, "configs", "prune_2_4.toml"), output=tmp_path / "pruned.onnx")
    assert (tmp_path / "pruned.onnx").exists()
    assert pruned["pattern"] == "N:M" and pruned["after"]["nonzero_parameters"] < pruned["before"]["nonzero_parameters"]

    data = [images[i : i + 32] for i in range(0, 128, 32)]
    ckpt = tmp_path / "qat.ckpt"
    r1 = sparsebit.qat(CNN, os.path.join(ROOT, "configs", "w4a4_lsq.toml"), calib=data, train=data,
                       output=tmp_path / "qat.onnx", epochs=1, lr=1e-4, checkpoint=ckpt)
    assert (tmp_path / "qat.onnx").exists() and ckpt.exists()
    r2 = sparsebit.qat(CNN, os.path.join(ROOT, "configs", "w4a4_lsq.toml"), calib=data, train=data,
                       output=tmp_path / "qat2.onnx", epochs=2, lr=1e-4, checkpoint=ckpt)
    assert r1["qat"]["resumed_after_epoch"] == 0 and len(r1["qat"]["epochs"]) == 1
    assert r2["qat"]["resumed_after_epoch"] == 1 and r2["qat"]["epochs"][-1]["epoch"] == 2


def test_external_data(tmp_path, images):
    qm = sparsebit.QuantModel(CNN, W8A8)
    qm.calibrate(images[:64])
    qm.export(tmp_path / "m.onnx", external_data=True)
    assert (tmp_path / "m.onnx.data").stat().st_size > 0
    m = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer)
    qm.export(tmp_path / "n.onnx", external_data="weights.bin")
    n = onnx.load(str(tmp_path / "n.onnx"), load_external_data=False)
    locations = {e.value for t in n.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"weights.bin"} and (tmp_path / "weights.bin").stat().st_size > 0
    # Loaded with its external data, it is the model exported inline.
    qm.export(tmp_path / "inline.onnx")
    assert not (tmp_path / "inline.onnx.data").exists()
    inline = onnx.load(str(tmp_path / "inline.onnx"))
    loaded = onnx.load(str(tmp_path / "n.onnx"))
    for a, b in zip(inline.graph.initializer, loaded.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    with pytest.raises(sparsebit.Error, match="file name"):
        qm.export(tmp_path / "o.onnx", external_data=str(tmp_path / "elsewhere" / "w.bin"))


def test_outputs_never_replace_inputs(tmp_path, images):
    """Every call refuses, before any work, an output that is one of its inputs (the model, the
    config file) or another output; the inputs keep their bytes."""
    model, config = tmp_path / "m.onnx", tmp_path / "c.toml"
    model.write_bytes(open(CNN, "rb").read())
    config.write_bytes(open(W8A8, "rb").read())
    prune_config = os.path.join(ROOT, "configs", "prune_2_4.toml")
    before = (model.read_bytes(), config.read_bytes())
    data = [images[:32]]
    out = tmp_path / "out.onnx"
    attempts = [
        lambda: sparsebit.quantize(model, config, calib=data, output=model),
        lambda: sparsebit.quantize(model, config, calib=data, output=out, report=model),
        lambda: sparsebit.quantize(model, config, calib=data, output=config),
        lambda: sparsebit.quantize(model, config, calib=data, output=out, report=out),
        lambda: sparsebit.prune(model, prune_config, output=model),
        lambda: sparsebit.qat(model, config, calib=data, train=data, output=model, epochs=1),
        lambda: sparsebit.qat(model, config, calib=data, train=data, output=out, epochs=1, checkpoint=model),
    ]
    for attempt in attempts:
        with pytest.raises(sparsebit.Error, match="is the same file as"):
            attempt()
    qm = sparsebit.QuantModel(str(model), str(config))
    qm.calibrate(data)
    with pytest.raises(sparsebit.Error, match="the same file as the model"):
        qm.export(model)
    with pytest.raises(sparsebit.Error, match="the same file as the config"):
        qm.export(str(config).encode())  # a bytes path names the same file
    with pytest.raises(sparsebit.Error, match="external_data .* is the same file as path"):
        qm.export(tmp_path / "x.onnx", external_data="x.onnx")
    assert (model.read_bytes(), config.read_bytes()) == before
    assert not out.exists()


def test_paths_as_open_takes_them(tmp_path, images):
    """str, bytes and os.PathLike name the same file; an embedded NUL is refused, not cut short."""
    qm = sparsebit.QuantModel(CNN.encode(), W8A8.encode())
    qm.calibrate([images[:32]])
    qm.export(bytes(tmp_path / "b.onnx"))
    assert (tmp_path / "b.onnx").exists() and not list(tmp_path.glob("b'*"))
    with pytest.raises(sparsebit.Error, match="NUL"):
        qm.export(str(tmp_path / "x.onnx") + "\0.txt")
    with pytest.raises(sparsebit.Error, match="NUL"):
        sparsebit.Config.from_file(W8A8 + "\0junk")
    assert not (tmp_path / "x.onnx").exists()


def test_config_dicts_that_cannot_be_toml_name_their_key():
    d = {}
    d["w"] = d
    with pytest.raises(sparsebit.Error, match="contain itself"):
        sparsebit.Config(d)
    looped = []
    looped.append(looped)
    with pytest.raises(sparsebit.Error, match="contain itself"):
        sparsebit.Config({"skip": looped})
    deep = cur = {}
    for _ in range(100000):
        cur["a"] = {}
        cur = cur["a"]
    with pytest.raises(sparsebit.Error, match="nested more than"):
        sparsebit.Config(deep)
    with pytest.raises(sparsebit.Error, match="calibration.count .* 64-bit"):
        sparsebit.Config({"calibration": {"count": 2**70}})
    with pytest.raises(sparsebit.Error, match="backend is not valid Unicode"):
        sparsebit.Config({"backend": "\udcff"})
    for text in ("a" + ".a" * 100000 + " = 1", "[" + "a." * 100000 + "a]"):
        with pytest.raises(sparsebit.Error, match="dotted parts"):
            sparsebit.Config.from_string(text)


CONFIG_FUZZ = r"""
import random, sys
import sparsebit

rng = random.Random(int(sys.argv[1]))
KEYS = ["w", "a", "backend", "skip", "calibration", "count", "bit", "observer", "qscheme", "specific",
        "nodes", "target", "value", "sparse", "ratio", "schedule", "x", "", "\udcff", "a.b", "\x00"]
LEAVES = [0, -1, 2**63, 2**70, -2**64, 1.5, float("nan"), float("inf"), True, None, "", "minmax", "\udcff",
          "a\x00b", b"bytes", 1j, object(), (1, 2), {1, 2}, range(3), "x" * 5000]

def build(depth, pool):
    roll = rng.random()
    if depth > 5 or roll < 0.35:
        return rng.choice(LEAVES) if rng.random() < 0.9 or not pool else rng.choice(pool)
    if roll < 0.7:
        d = {}
        pool.append(d)
        for _ in range(rng.randint(0, 4)):
            key = rng.choice(KEYS) if rng.random() < 0.95 else rng.choice([1, None, (1,)])
            d[key] = build(depth + 1, pool)
        return d
    items = []
    pool.append(items)
    items.extend(build(depth + 1, pool) for _ in range(rng.randint(0, 4)))
    return items

made = refused = 0
for _ in range(int(sys.argv[2])):
    top = {}
    pool = [top]
    for _ in range(rng.randint(1, 5)):
        top[rng.choice(KEYS)] = build(0, pool)
    try:
        sparsebit.Config(top)
        made += 1
    except (sparsebit.Error, TypeError) as e:
        message = str(e)
        assert len(message.split(": ", 1)[-1]) > 8, f"an error that says nothing: {message!r}"
        refused += 1
print(f"made {made}, refused {refused}")
"""


def test_config_dicts_fuzzed_never_crash(tmp_path):
    """Random dicts and lists (self-references, cycles through lists, odd keys and leaves) make
    a Config or raise an error with a message: the process never crashes or hangs."""
    script = tmp_path / "fuzz_config_dicts.py"
    script.write_text(CONFIG_FUZZ)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for seed in range(4):
        run = subprocess.run([sys.executable, str(script), str(seed), "500"], capture_output=True, text=True,
                             timeout=300, env=env)
        assert run.returncode == 0, f"seed {seed}: status {run.returncode}: {run.stderr[-2000:]}"
        made, refused = (int(w) for w in run.stdout.replace(",", "").split()[1::2])
        assert made + refused == 500 and refused > 0


def test_a_child_forked_after_a_run_calibrates(tmp_path, images):
    """GNU OpenMP cannot restart its threads in a child of fork(): a child forked after a run on
    several threads calibrates on one (and says so) instead of waiting forever."""
    data = [images[:64]]
    sparsebit.quantize(CNN, W8A8, calib=data, output=tmp_path / "parent.onnx")
    log = tmp_path / "child.log"
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            signal.alarm(120)  # a hang ends the child with SIGALRM, which the parent reports
            fd = os.open(log, os.O_WRONLY | os.O_CREAT)
            os.dup2(fd, 2)
            sparsebit.quantize(CNN, W8A8, calib=data, output=tmp_path / "child.onnx")
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child ended with wait status {status}"
    assert (tmp_path / "child.onnx").stat().st_size > 0
    if os.cpu_count() > 1:
        assert "forked after sparsebit computed on several threads" in log.read_text()


def test_workers_of_one_host_share_its_cores_as_the_command_does(tmp_path):
    # Note [Threads per process]: under torchrun (LOCAL_WORLD_SIZE) each worker takes its share
    # of the cores from import on, as `sparsebit --nproc` workers do; set_threads(0) keeps it.
    cores = os.cpu_count()  # what std::thread::hardware_concurrency counts
    code = ("import sparsebit; a = sparsebit.threads(); sparsebit.set_threads(0); b = sparsebit.threads(); "
            "sparsebit.set_threads(10**6); print(a, b, sparsebit.threads())")
    for workers in (1, 2, 4):
        env = dict(os.environ, LOCAL_WORLD_SIZE=str(workers))
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
        share = max(1, cores // workers)
        got = [int(v) for v in out.stdout.split()]
        assert got[1:] == [share, cores], (workers, got)
        if workers > 1:
            assert got[0] == share
