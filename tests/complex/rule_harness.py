"""Run one function through export + ``lower`` (a strategy) and compare with eager PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tetrt_support.complex import lower


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _packed(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(x.resolve_conj()) if x.is_complex() else x


def lowered(fn: Callable[..., Any], *args: torch.Tensor, strategy: str, dynamic_shapes: Any = None) -> Callable[..., Any]:
    """``fn`` exported with ``args`` and lowered; the result takes and returns packed tensors."""
    program = torch.export.export(_Fn(fn), args, dynamic_shapes=dynamic_shapes, strict=False)
    gm = lower(program, strategy=strategy)

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        out = gm(*(_packed(x) for x in inputs))
        return out[0] if isinstance(out, (tuple, list)) else out

    return run


def assert_same_as_eager(
    fn: Callable[..., Any], got: torch.Tensor, *args: torch.Tensor, rtol: float, of_largest: bool = False
) -> None:
    """``got`` (packed) equals ``fn(*args)`` of eager PyTorch: NaN where it is NaN, the same
    infinities, and finite values within ``rtol`` of each element, or within 8 ulps of 1
    where eager's value is (near) zero. ``of_largest``: within ``rtol`` of the largest
    magnitude instead (a transform's rounding error scales with the whole signal, so an
    output that cancels to near zero carries the error of its large neighbours)."""
    want = _packed(fn(*args))
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    atol = 8 * torch.finfo(want.dtype).eps if want.is_floating_point() else 0
    if of_largest:
        atol = max(atol, rtol * want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
