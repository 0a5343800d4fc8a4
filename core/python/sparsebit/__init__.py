"""Sparsebit: quantize ONNX models to low-bit QDQ ONNX for ONNX Runtime and TensorRT.

The same pipeline as the ``sparsebit`` command, from Python::

    import numpy as np
    import sparsebit

    model = sparsebit.load("model.onnx")
    qm = sparsebit.QuantModel(model, sparsebit.Config.from_file("configs/w8a8_onnxruntime.toml"))
    qm.calibrate(np.random.rand(3, 224, 224).astype(np.float32) for _ in range(64))
    y = qm.forward(x)                     # the simulated quantized model, numpy out
    qm.export("model_int8.onnx")

A torch.nn.Module comes in as well: it is exported with torch.onnx (dynamic batch, node names
from the module hierarchy) and ``forward`` then takes and returns torch tensors::

    qm = sparsebit.QuantModel(net, "qconfig.yaml", example_inputs=torch.randn(1, 3, 224, 224))

Configs are TOML files or the original toolkit's YAML files (upper-case keys).
Data is any iterable of numpy arrays (single-input models), of dicts name -> array, or of
tuples in input order; torch tensors and other arrays come in through DLPack or __array__.
Every error is a :class:`sparsebit.Error` (a RuntimeError) with the message the command prints.
See docs/PYTHON.md.
"""

from . import _sparsebit, _torch
from ._sparsebit import (  # noqa: F401
    Config,
    Error,
    Model,
    __version__,
    abi_version,
    load,
    memory_limit,
    plugins,
    sdk_version,
    set_log_level,
    set_memory_limit,
    set_threads,
    threads,
)

__all__ = [
    "Config",
    "Error",
    "Model",
    "QuantModel",
    "load",
    "memory_limit",
    "plugins",
    "profile",
    "prune",
    "qat",
    "quantize",
    "set_log_level",
    "set_memory_limit",
    "set_threads",
    "threads",
]


class QuantModel(_sparsebit.QuantModel):
    """A model with quantizers placed by a config's backend and passes.

    model: an ONNX path, a sparsebit.Model, or a torch.nn.Module with example_inputs (a tensor,
    or a tuple of them, of the shapes forward takes); a module is exported with torch.onnx at
    `opset` and its forward() then returns torch tensors. config: a Config, a dict, or a TOML or
    original YAML file.
    """

    def __init__(self, model, config, *, example_inputs=None, calib=None, opset=_torch.DEFAULT_OPSET,
                 input_names=None):
        self._exported = None
        self._recorded = None  # inputs seen between prepare_calibration() and calc_qparams()
        if _torch.is_module(model):
            self._exported = _torch.ExportedModule(model, example_inputs, opset=opset, input_names=input_names)
            model = self._exported.path
        elif example_inputs is not None:
            raise Error("example_inputs= is for torch modules; an ONNX model declares its own inputs")
        super().__init__(model, config, calib=calib)
        if self._exported is not None and _sparsebit._linked_torch():
            self._return_torch(True)  # the same tensors both sides, no copy

    def forward(self, *args, quantized=True):
        """The simulated quantized model (quantized=False: the float one) on one batch: numpy
        arrays out, or torch tensors for a model made from a torch module or after init_qat().
        After init_qat(), with torch's grad mode on, the outputs carry autograd history through
        the C++ fake quantizers, so loss.backward() reaches parameters()."""
        if self._recorded is not None:  # collecting calibration samples: the float model runs
            self._recorded.append(tuple(_torch.detached(a) for a in args))
            quantized = False
        out = super().forward(*args, quantized=quantized)
        return _torch.to_torch(out) if self._exported is not None else out

    def __call__(self, *args, quantized=True):
        return self.forward(*args, quantized=quantized)

    def parameters(self):
        """The trainable tensors after init_qat(): weights, biases and quantizer parameters (scales,
        offsets, clipping values), in a fixed order; give them to any torch.optim optimizer."""
        return [t for _, t in self.named_parameters()]

    def train(self, mode=True):
        """Training mode (init_qat() turns it on): BatchNormalization uses batch statistics."""
        self._train(mode)
        return self

    def eval(self):
        return self.train(False)

    # The original toolkit's spelling of the same steps: calibrate with your own forward passes.
    def prepare_calibration(self):
        """From now until calc_qparams(), forward() runs the float model and keeps its inputs."""
        self._recorded = []

    def calc_qparams(self, progress=None):
        """Calibrates on the inputs forward() saw since prepare_calibration()."""
        if not self._recorded:
            raise Error("calc_qparams() needs prepare_calibration() and at least one forward() after it")
        data, self._recorded = self._recorded, None
        return self.calibrate(data, progress=progress)

    def init_QAT(self, data=None, progress=None):  # noqa: N802 (the original's name)
        """init_qat(): on `data`, or from the calibration calibrate() or calc_qparams() did."""
        return self.init_qat(data, progress=progress)

    def export_onnx(self, dummy_input=None, name="qmodel.onnx", **kwargs):
        """export(name): the original's signature (dummy_input is not needed: the graph is known)."""
        return self.export(name, **kwargs)


def _module_job(job):
    """A job of the command (quantize, qat, prune) that also takes a torch module."""

    def run(model, config, *, example_inputs=None, opset=_torch.DEFAULT_OPSET, input_names=None, **kwargs):
        if _torch.is_module(model):
            exported = _torch.ExportedModule(model, example_inputs, opset=opset, input_names=input_names)
            return job(exported.path, config, **kwargs)
        if example_inputs is not None:
            raise Error("example_inputs= is for torch modules; an ONNX model declares its own inputs")
        return job(model, config, **kwargs)

    run.__name__ = job.__name__
    run.__doc__ = (job.__doc__ or "") + (
        "\n\nmodel may also be a torch.nn.Module with example_inputs= (a tensor or a tuple of them): it is "
        "exported with torch.onnx at `opset` first."
    )
    return run


quantize = _module_job(_sparsebit.quantize)
qat = _module_job(_sparsebit.qat)
prune = _module_job(_sparsebit.prune)


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
