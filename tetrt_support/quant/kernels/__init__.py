"""Fast CUDA (Triton) twins of :mod:`tetrt_support.quant.numerics` and the quantized GEMMs.

Each quantization function takes its twin's arguments and returns the same buffers, byte
for byte (``scripts/gpu_check.py``, ``tests/quant/test_kernels_cpu.py``). Modules:
:mod:`.float8`, :mod:`.mxfp8`, :mod:`.nvfp4` (quantization), :mod:`.dequantize`,
:mod:`.transpose`, :mod:`.gemm`, and :mod:`.dispatch` (the fast-path tables, which each
format module fills). Triton is imported lazily: ``import tetrt_support.quant`` never needs it.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports (it is optional: only the CUDA fast paths need it)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def enabled(x: torch.Tensor) -> bool:
    """Whether the fast path applies to ``x``: a CUDA tensor, Triton present, not disabled.

    ``TETRT_QUANT_KERNELS=0`` turns the kernels off (the reference runs instead; FP8 current
    scaling runs it compiled on CUDA:
    :func:`~tetrt_support.quant.float8_tensor.current_scaling_route`), which is how the GPU
    check and the benchmarks compare the two on one machine. Inside a torch.compile trace
    the fast path is never taken (the tracer sees the reference ops).
    """
    if os.environ.get("TETRT_QUANT_KERNELS", "1") == "0":
        return False
    if not (x.is_cuda or (interpreting() and x.device.type == "cpu")):
        return False
    if torch.compiler.is_compiling():
        return False
    return triton_available()
