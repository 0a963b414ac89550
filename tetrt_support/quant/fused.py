"""Fused per-tensor FP8 current-scaling quantization for CUDA tensors (torch.compile'd).

Eager PyTorch runs the current-scaling recipe as about eight kernels (abs, amax, the scale
arithmetic, multiply, clamp, cast, transpose), each a pass over the whole tensor; next to
an FP8 GEMM those passes cost about as much as the GEMM. Inductor fuses them into one
reduction and one pointwise kernel. The compiled function is written with the same
:mod:`~tetrt_support.quant.numerics` functions as the eager path, so it produces the same
bytes (``tests/quant/test_fused.py`` checks this through inductor's CPU backend; the CUDA
build of the same graph ran only in the H200 benchmark).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from tetrt_support.quant import numerics

Buffers = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]


def current_scaling_buffers(
    x2d: torch.Tensor, fp8_dtype: torch.dtype, power_of_2: bool, epsilon: float, rowwise: bool, columnwise: bool
) -> Buffers:
    """``(data, transpose, scale_inv)`` of FP8 current scaling for a non-empty (M, K) tensor."""
    amax = x2d.abs().amax().float()
    scale = numerics.scale_from_amax(amax, numerics.fp8_max(fp8_dtype), power_of_2=power_of_2, epsilon=epsilon)
    data = numerics.cast_to_fp8(x2d, scale, fp8_dtype)
    return (data if rowwise else None, data.t().contiguous() if columnwise else None, (1.0 / scale).reshape(1).float())


@functools.cache
def compiled_current_scaling_buffers() -> Callable[..., Buffers]:
    """:func:`current_scaling_buffers` compiled once per process (shapes are dynamic after a change)."""
    return torch.compile(current_scaling_buffers, fullgraph=True)


def should_fuse(x: torch.Tensor) -> bool:
    """Fuse on CUDA only, outside a trace (inside one, the caller's compiler fuses anyway)."""
    return x.is_cuda and x.numel() > 0 and not torch.compiler.is_compiling()
