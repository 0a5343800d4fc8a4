"""Calibration from image files (Note [Image data]): each preset against torchvision's transforms
or the preprocessing its family's inference code applies, written here with torch and numpy on
images decoded by PIL; end to end, Fashion-MNIST written as PNG calibrates as its IDX file does.
"""

import gzip
import json
import math
import os
import subprocess

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as TF
import torchvision.transforms.functional as F
from onnx import TensorProto, helper
from PIL import Image

import sparsebit

ROOT = os.environ.get("SPARSEBIT_ROOT", os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("SPARSEBIT_BIN", os.path.join(ROOT, "build", "bin", "sparsebit"))
CNN = os.path.join(ROOT, "examples", "fashion_mnist", "fashion_mnist_cnn.onnx")
W8A8 = os.path.join(ROOT, "configs", "w8a8_tensorrt.toml")
FASHION = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SIZES = [(300, 400), (513, 257), (224, 224), (100, 90), (37, 610)]


def relu_model(path, shape):
    """y = Relu(x): a model whose input declares `shape` (strings are open dims)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return sparsebit.load(str(path))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """Smooth colour images of several sizes and aspects, one folder per format."""
    root = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(7)
    for ext in ("png", "bmp", "jpg"):
        (root / ext).mkdir()
    for i, (h, w) in enumerate(SIZES):
        yy, xx = np.mgrid[0:h, 0:w]
        channels = [np.sin(xx / rng.uniform(5, 40) + c) * np.cos(yy / rng.uniform(5, 40)) for c in range(3)]
        noise = rng.normal(0, 12, (h, w, 3))
        pixels = np.clip(127.5 + 100 * np.stack(channels, -1) + noise, 0, 255).astype(np.uint8)
        for ext in ("png", "bmp", "jpg"):
            Image.fromarray(pixels).save(root / ext / f"im{i}.{ext}", quality=92)
    return root


def config(tmp_path, text):
    path = tmp_path / "data.toml"
    path.write_text(text)
    return str(path)


def pil_tensor(path, mode="RGB"):
    """[1, C, H, W] float pixels 0..255 as PIL decodes them."""
    return F.pil_to_tensor(Image.open(path).convert(mode)).float().unsqueeze(0)


def files(folder):
    return sorted(str(folder / f) for f in os.listdir(folder))


def imagenet_reference(path):
    t = pil_tensor(path)[0] / 255
    t = F.resize(t, 256, antialias=True)
    t = F.center_crop(t, [224, 224])
    return F.normalize(t, IMAGENET_MEAN, IMAGENET_STD).unsqueeze(0).numpy()


@pytest.mark.parametrize("ext", ["png", "bmp"])
def test_imagenet_preset_is_torchvisions_resize_crop_and_normalize(tmp_path, pictures, ext):
    model = relu_model(tmp_path / "m.onnx", ["n", 3, "h", "w"])
    got = model.samples(str(pictures / ext), config=config(tmp_path, '[data]\npreset = "imagenet"\n'))
    want = [imagenet_reference(f) for f in files(pictures / ext)]
    assert len(got) == len(want) == len(SIZES)
    for g, w in zip(got, want):
        assert g.shape == (1, 3, 224, 224)
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def test_jpeg_differs_from_pils_decoding_only_by_the_decoders_rounding(tmp_path, pictures):
    model = relu_model(tmp_path / "m.onnx", ["n", 3, "h", "w"])
    got = model.samples(str(pictures / "jpg"), config=config(tmp_path, '[data]\npreset = "imagenet"\n'))
    for g, f in zip(got, files(pictures / "jpg")):
        diff = np.abs(g - imagenet_reference(f)) * np.array(IMAGENET_STD).reshape(1, 3, 1, 1) * 255
        # Pixel levels: two JPEG decoders' IDCTs and chroma upsampling differ (measured: mean 0.07,
        # largest 2.8 on these images).
        assert diff.mean() < 0.3
        assert diff.max() < 5


def paddle_rec_reference(path):
    """PaddleOCR's resize_norm_img at [3, 48, 320]: BGR, width ceil(48 w / h) up to 320, padded with 0."""
    bgr = pil_tensor(path).flip(1)
    h, w = bgr.shape[2:]
    width = min(320, int(math.ceil(48 * w / h)))
    t = TF.interpolate(bgr, size=(48, width), mode="bilinear", align_corners=False)
    t = (t / 255 - 0.5) / 0.5
    out = torch.zeros(1, 3, 48, 320)
    out[:, :, :, :width] = t
    return out.numpy(), width


def test_paddleocr_rec_preset_keeps_the_aspect_and_pads_with_zero(tmp_path, pictures):
    model = relu_model(tmp_path / "m.onnx", ["n", 3, 48, "w"])
    got = model.samples(str(pictures / "png"), config=config(tmp_path, '[data]\npreset = "paddleocr_rec"\n'))
    widths = []
    for g, f in zip(got, files(pictures / "png")):
        want, width = paddle_rec_reference(f)
        widths.append(width)
        np.testing.assert_allclose(g, want, rtol=0, atol=2e-5)
    assert 320 in widths and min(widths) < 320  # both a squeezed and a padded line were checked


def test_paddleocr_det_preset_limits_the_longer_side_to_multiples_of_32(tmp_path, pictures):
    model = relu_model(tmp_path / "m.onnx", ["n", 3, "h", "w"])
    cfg = config(tmp_path, '[data]\npreset = "paddleocr_det"\nresize = 320\n')  # a smaller limit, so it shrinks
    got = model.samples(str(pictures / "png"), config=cfg)
    for g, f in zip(got, files(pictures / "png")):
        bgr = pil_tensor(f).flip(1)
        h, w = bgr.shape[2:]
        ratio = 320 / max(h, w) if max(h, w) > 320 else 1.0
        rh = max(int(round(int(h * ratio) / 32) * 32), 32)
        rw = max(int(round(int(w * ratio) / 32) * 32), 32)
        t = TF.interpolate(bgr, size=(rh, rw), mode="bilinear", align_corners=False) / 255
        mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        np.testing.assert_allclose(g, ((t - mean) / std).numpy(), rtol=0, atol=2e-5)


def test_yolo_preset_letterboxes_on_grey(tmp_path, pictures):
    model = relu_model(tmp_path / "m.onnx", ["n", 3, 640, 640])
    got = model.samples(str(pictures / "png"), config=config(tmp_path, '[data]\npreset = "yolo"\n'))
    for g, f in zip(got, files(pictures / "png")):
        rgb = pil_tensor(f)
        h, w = rgb.shape[2:]
        r = min(640 / h, 640 / w)
        nw, nh = int(round(w * r)), int(round(h * r))
        dw, dh = (640 - nw) / 2, (640 - nh) / 2
        top, left = int(round(dh - 0.1)), int(round(dw - 0.1))
        out = torch.full((1, 3, 640, 640), 114.0)
        out[:, :, top : top + nh, left : left + nw] = TF.interpolate(
            rgb, size=(nh, nw), mode="bilinear", align_corners=False
        )
        np.testing.assert_allclose(g, (out / 255).numpy(), rtol=0, atol=2e-5)


def test_grey_nhwc_input_of_fixed_size_is_resized_to_it(tmp_path, pictures):
    model = relu_model(tmp_path / "m.onnx", ["n", 64, 48, 1])
    cfg = config(tmp_path, '[data]\nchannels = "GRAY"\nantialias = false\nmean = 0.5\nstd = 0.25\n')
    got = model.samples(str(pictures / "png"), config=cfg, count=2)
    assert len(got) == 2
    for g, f in zip(got, files(pictures / "png")):
        rgb = pil_tensor(f)
        grey = 0.299 * rgb[:, 0:1] + 0.587 * rgb[:, 1:2] + 0.114 * rgb[:, 2:3]
        t = TF.interpolate(grey, size=(64, 48), mode="bilinear", align_corners=False)
        want = ((t / 255 - 0.5) / 0.25).permute(0, 2, 3, 1).numpy()
        assert g.shape == (1, 64, 48, 1)
        np.testing.assert_allclose(g, want, rtol=0, atol=2e-5)


def test_undecodable_files_are_named_or_skipped_as_asked(tmp_path, pictures):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for f in files(pictures / "png")[:2]:
        (folder / os.path.basename(f)).write_bytes(open(f, "rb").read())
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    model = relu_model(tmp_path / "m.onnx", ["n", 3, "h", "w"])
    with pytest.raises(RuntimeError, match=r"broken\.png.*undecodable"):
        model.samples(str(folder), config=config(tmp_path, '[data]\npreset = "imagenet"\n'))
    cfg = config(tmp_path, '[data]\npreset = "imagenet"\nundecodable = "skip"\n')
    assert len(model.samples(str(folder), config=cfg)) == 2


def test_images_without_a_data_table_ask_for_one(tmp_path, pictures):
    model = relu_model(tmp_path / "m.onnx", ["n", 3, "h", "w"])
    with pytest.raises(RuntimeError, match=r"no \[data\] table.*preset"):
        model.samples(str(pictures / "png"))
    with pytest.raises(RuntimeError, match=r"channels = \"GRAY\""):
        relu_model(tmp_path / "g.onnx", ["n", 1, 28, 28]).samples(
            str(pictures / "png"), config=config(tmp_path, '[data]\npreset = "imagenet"\n')
        )
    with pytest.raises(RuntimeError, match=r"unknown preset 'imagnet'; did you mean 'imagenet'"):
        model.samples(str(pictures / "png"), config=config(tmp_path, '[data]\npreset = "imagnet"\n'))


def fashion_pngs(folder, count):
    """The first `count` Fashion-MNIST test images as 8-bit grey PNG files, in order."""
    with gzip.open(FASHION, "rb") as f:
        f.read(16)
        raw = np.frombuffer(f.read(count * 28 * 28), dtype=np.uint8).reshape(count, 28, 28)
    folder.mkdir()
    for i, image in enumerate(raw):
        Image.fromarray(image, mode="L").save(folder / f"{i:05d}.png")


def test_fashion_mnist_as_png_calibrates_as_its_idx_file(tmp_path):
    fashion_pngs(tmp_path / "png", 64)
    cfg = tmp_path / "w8a8.toml"
    cfg.write_text(open(W8A8).read() + '\n[data]\nchannels = "GRAY"\n[latency]\nenabled = false\n')
    reports = {}
    for name, calib in (("idx", FASHION), ("png", str(tmp_path / "png"))):
        subprocess.run(
            [BIN, "--quiet", "quantize", CNN, "-c", str(cfg), "--calib", calib, "--calib-count", "64",
             "-o", str(tmp_path / f"{name}.onnx"), "--report", str(tmp_path / f"{name}.json")],
            check=True,
        )
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
    scales = {
        name: {(s["node"], s["input_index"]): s.get("scale") for s in r["quantized_inputs"]}
        for name, r in reports.items()
    }
    assert len(scales["idx"]) > 5
    assert scales["png"] == scales["idx"]
    assert (tmp_path / "png.onnx").read_bytes() == (tmp_path / "idx.onnx").read_bytes()
    # The Python package reads the folder through the same [data] table.
    qm = sparsebit.QuantModel(CNN, str(cfg))
    qm.calibrate(str(tmp_path / "png"))
    qm.export(str(tmp_path / "python.onnx"))
    assert (tmp_path / "python.onnx").read_bytes() == (tmp_path / "idx.onnx").read_bytes()
