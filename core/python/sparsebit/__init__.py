"""Sparsebit: quantize ONNX models to low-bit QDQ ONNX for ONNX Runtime and TensorRT.

The same pipeline as the ``sparsebit`` command, from Python::

    import numpy as np
    import sparsebit

    model = sparsebit.load("model.onnx")
    qm = sparsebit.QuantModel(model, sparsebit.Config.from_file("configs/w8a8_onnxruntime.toml"))
    qm.calibrate(np.random.rand(3, 224, 224).astype(np.float32) for _ in range(64))
    y = qm.forward(x)                     # the simulated quantized model, numpy out
    qm.export("model_int8.onnx")

Data is any iterable of numpy arrays (single-input models), of dicts name -> array, or of
tuples in input order; torch tensors and other arrays come in through DLPack or __array__.
Every error is a :class:`sparsebit.Error` (a RuntimeError) with the message the command prints.
See docs/PYTHON.md.
"""

from ._sparsebit import (  # noqa: F401
    Config,
    Error,
    Model,
    QuantModel,
    __version__,
    abi_version,
    load,
    plugins,
    prune,
    qat,
    quantize,
    sdk_version,
    set_log_level,
    set_threads,
    threads,
)

__all__ = [
    "Config",
    "Error",
    "Model",
    "QuantModel",
    "load",
    "plugins",
    "profile",
    "prune",
    "qat",
    "quantize",
    "set_log_level",
    "set_threads",
    "threads",
]


def profile(qmodel, data, *, samples=64, mode="both", output=None):
    """Per-layer quantization error of a calibrated QuantModel on `data` (as `sparsebit profile`).

    mode: "both", "accumulated" (every layer quantized) or "single" (one layer at a time).
    Returns the report as a dict; with `output`, also writes OUTPUT.json and OUTPUT.html.
    """
    return qmodel._profile(data, samples, mode, output)


# As the command does: every core for LibTorch (Debian's LibTorch starts with one), and only
# warnings on stderr unless asked (set_log_level("info") shows the pipeline's steps).
set_threads(0)
set_log_level("warning")
