"""torch.nn.Module in: the module is exported with torch.onnx, then runs the same pipeline.

torch is imported only when a module is given: the package works without it for ONNX files.
"""

import inspect
import os
import sys
import tempfile

from . import _sparsebit

# torch.onnx in torch 1.13 writes opsets up to 17; later versions write it too.
DEFAULT_OPSET = 17


def is_module(obj):
    """Whether obj is a torch.nn.Module (without importing torch when it was never imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _as_args(example_inputs):
    import torch

    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in example_inputs):
        return tuple(example_inputs)
    raise _sparsebit.Error(
        "example_inputs must be a torch tensor or a tuple of them, one per argument of the module's forward "
        f"(got {type(example_inputs).__name__})"
    )


def _names(module, count):
    """The forward's parameter names (the ONNX inputs keep them), or input0, input1, ..."""
    try:
        params = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return params[:count] if len(params) >= count else [f"input{i}" for i in range(count)]


def _output_names(outputs):
    import torch

    if isinstance(outputs, torch.Tensor):
        return ["output"]
    if isinstance(outputs, (tuple, list)):
        return [f"output{i}" for i in range(len(outputs))]
    if isinstance(outputs, dict):
        return [str(k) for k in outputs]
    raise _sparsebit.Error(
        f"the module's forward returns {type(outputs).__name__}; it must return a tensor, a tuple/list or a dict "
        "of tensors to be exported"
    )


def export_module(module, example_inputs, path, *, opset=DEFAULT_OPSET, input_names=None, dynamic_batch=True):
    """Exports `module` (in eval mode) to ONNX at `path` with torch.onnx.

    Node names keep the module hierarchy (`/backbone/backbone.0/Conv`), so config globs can name
    modules (`backbone*`, `head.fc`). With dynamic_batch, axis 0 of every input and output is
    the symbolic dimension "batch". Returns path.
    """
    import torch

    if example_inputs is None:
        raise _sparsebit.Error(
            f"a torch module ({type(module).__name__}) needs example_inputs=: a tensor (or a tuple, one per forward "
            "argument) of the shape the model takes, e.g. torch.randn(1, 3, 224, 224); it is exported with torch.onnx"
        )
    args = _as_args(example_inputs)
    names = list(input_names) if input_names is not None else _names(module, len(args))
    if len(names) != len(args):
        raise _sparsebit.Error(f"input_names has {len(names)} names for {len(args)} example inputs")
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            outputs = module(*args)
        output_names = _output_names(outputs)
        dynamic_axes = None
        if dynamic_batch:
            dynamic_axes = {n: {0: "batch"} for n, x in zip(names, args) if x.dim() > 0}
            dynamic_axes.update({n: {0: "batch"} for n in output_names})
        torch.onnx.export(
            module,
            args,
            path,
            input_names=names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
        )
    except _sparsebit.Error:
        raise
    except Exception as e:  # the exporter's own errors, said as ours with what to try
        raise _sparsebit.Error(
            f"torch.onnx could not export {type(module).__name__} (torch {torch.__version__}, opset {opset}): {e}; "
            "export it yourself and give the ONNX file"
        ) from e
    finally:
        module.train(was_training)
    return path


class ExportedModule:
    """A module exported to a temporary folder that lives as long as this object."""

    def __init__(self, module, example_inputs, *, opset=DEFAULT_OPSET, input_names=None):
        self._folder = tempfile.TemporaryDirectory(prefix="sparsebit-module-")
        self.path = export_module(
            module,
            example_inputs,
            os.path.join(self._folder.name, type(module).__name__ + ".onnx"),
            opset=opset,
            input_names=input_names,
        )


def detached(value):
    """A copy of one forward() argument to keep: torch tensors detached on the host, the rest as is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    return value


def to_torch(value):
    """numpy array(s) from the extension as torch tensors (sharing their memory); torch tensors
    as they are."""
    import numpy as np
    import torch

    if isinstance(value, tuple):
        return tuple(to_torch(v) for v in value)
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value
