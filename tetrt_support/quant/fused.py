"""Fused per-tensor FP8 current-scaling quantization (torch.compile'd), for CUDA tensors.

Eager PyTorch runs the current-scaling recipe as about eight kernels (abs, amax, the scale
arithmetic, multiply, clamp, cast, transpose), each a pass over the whole tensor; next to
an FP8 GEMM those passes cost about as much as the GEMM. Inductor fuses them into one
reduction and one pointwise kernel. The compiled function is written with the same
:mod:`~tetrt_support.quant.numerics` functions as the eager path, so it produces the same
bytes (``tests/quant/test_fused.py`` checks this through inductor's CPU backend; the CUDA
build of the same graph is not covered by the CPU tests). When it runs is decided with the
other fast paths, in :func:`tetrt_support.quant.float8_tensor.current_scaling_route`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from tetrt_support.quant import numerics


def current_scaling(
    x2d: torch.Tensor, fp8_dtype: torch.dtype, force_pow_2_scales: bool, amax_epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scale_inv)`` of FP8 current scaling for a non-empty (M, K) tensor: the
    reference :func:`~tetrt_support.quant.numerics.float8_current_scaling_quantize`."""
    data, scale_inv, _ = numerics.float8_current_scaling_quantize(
        x2d, fp8_dtype, force_pow_2_scales=force_pow_2_scales, amax_epsilon=amax_epsilon
    )
    return data, scale_inv


@functools.cache
def compiled_current_scaling() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """:func:`current_scaling` compiled once per process (shapes are dynamic after a change)."""
    return torch.compile(current_scaling, fullgraph=True)
