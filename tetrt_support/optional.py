"""Detection of the optional GPU back ends (TensorRT, torch-tensorrt, TransformerEngine).

None of them can be installed or imported on the CPU machines this project is built on,
so every path that uses them is guarded, imported lazily and was NOT run there. Probing
imports the package in a subprocess-free way but never lets an import error escape:
``import torch_tensorrt`` needs an NVIDIA driver even to import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch

OPTIONAL_BACKENDS = ("tensorrt", "torch_tensorrt", "transformer_engine")


@functools.cache
def available(module: str) -> bool:
    """Whether ``module`` is installed AND imports (a driver-less import counts as absent)."""
    if importlib.util.find_spec(module) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


def cuda_available() -> bool:
    return torch.cuda.is_available()


def availability_line() -> str:
    """One stable line (short enough for a notebook page) naming the back ends this run can use and skips."""
    names = ("cuda", *OPTIONAL_BACKENDS)
    usable = [m for m in names if (cuda_available() if m == "cuda" else available(m))]
    skipped = [m for m in names if m not in usable]
    return f"optional back ends: usable here: {', '.join(usable) or 'none'}; skipped: {', '.join(skipped) or 'none'}"
