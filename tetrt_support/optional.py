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
    """One stable line saying which optional back ends this run can use and which it skips."""
    parts = [f"cuda={'yes' if cuda_available() else 'no'}"]
    parts += [f"{m}={'yes' if available(m) else 'no'}" for m in OPTIONAL_BACKENDS]
    skipped = [m for m in ("cuda", *OPTIONAL_BACKENDS) if not (cuda_available() if m == "cuda" else available(m))]
    tail = f"; skipped here: {', '.join(skipped)}" if skipped else ""
    return "optional back ends: " + ", ".join(parts) + tail
