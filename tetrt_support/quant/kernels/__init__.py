"""Fast CUDA twins of :mod:`tetrt_support.quant.numerics` and the quantized GEMMs on Hopper.

Each quantization function here takes the same arguments as its twin in ``numerics`` and
returns the same buffers, byte for byte (``scripts/gpu_check.py`` checks this on the GPU
against the CPU reference, ``tests/quant/test_kernels_cpu.py`` on the CPU through Triton's
interpreter). What makes them fast is the memory traffic, not different arithmetic: the
high-precision tensor is read once per pass (FP8 current scaling: one amax pass and one
cast pass; the block formats: one pass), and the row-wise and column-wise layouts are
written from the same tile. Divisions are correctly rounded (``div_rn``) exactly where
the reference divides; where the reference multiplies by a rounded reciprocal, so do the
kernels.

- :mod:`.float8`: FP8 current scaling (amax, then cast + transpose), FP8 blockwise (1 x 128
  and 128 x 128 blocks, both layouts in one pass);
- :mod:`.mxfp8`, :mod:`.nvfp4`: quantization of both layouts from one read (NVFP4 with
  stochastic rounding too), and the bf16 operands of the emulated GEMMs;
- :mod:`.dequantize`: FP8 data times block scales as bf16 (MXFP8, FP8 blockwise);
- :mod:`.transpose`: a one-byte transpose for an FP8 operand that lacks its copy;
- :mod:`.gemm`: the native FP8 blockwise GEMM (``torch.nn.functional.scaled_mm`` with
  1 x 128 / 128 x 128 scales) and the emulated MXFP8 / NVFP4 GEMMs (bf16 operands that
  hold the dequantized values exactly, per-tensor scales applied after the GEMM);
- :mod:`.dispatch`: which quantizer / tensor takes which path (the two hooks the
  quantizers and ``ops.quantized_matmul`` call).

Triton is imported lazily: ``import tetrt_support.quant`` never needs it.
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

    ``TETRT_QUANT_KERNELS=0`` turns every fast path off (the reference runs instead), which
    is how the GPU check and the benchmarks compare the two on one machine. Inside a
    torch.compile trace the fast path is never taken (the tracer sees the reference ops).
    """
    if os.environ.get("TETRT_QUANT_KERNELS", "1") == "0":
        return False
    if not (x.is_cuda or (interpreting() and x.device.type == "cpu")):
        return False
    if torch.compiler.is_compiling():
        return False
    return triton_available()
