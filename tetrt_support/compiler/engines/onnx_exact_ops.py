"""Decompositions that keep three real ops exact where torch.onnx's translation is not.

The ONNX Runtime engine applies :data:`EXACT_DECOMPOSITIONS` (``aten.atan2``,
``aten.copysign``, ``aten.signbit``: ordinary ATen-level functions) to a block before
``torch.onnx.export``. What torchlib gets wrong and what stays open:
``docs/architecture.md`` ("Module notes", exact ONNX decompositions).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["EXACT_DECOMPOSITIONS", "atan2", "copysign", "signbit"]

aten = torch.ops.aten


def signbit(self: torch.Tensor) -> torch.Tensor:
    """Whether the sign bit of ``self`` is set, ``-0`` included (NaN reads as positive)."""
    if not self.is_floating_point():
        return self < 0
    negative_zero = torch.logical_and(self == 0, torch.reciprocal(self) < 0)
    return torch.logical_or(self < 0, negative_zero)


def _sign_factor(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """-1 where ``x``'s sign bit is set, else 1. Signs are applied by multiplying with it:
    ONNX Runtime's ``Where`` returns ``+0`` when it selects a ``-0``, ``Mul`` keeps IEEE signs."""
    return torch.where(signbit(x), -1.0, 1.0).to(dtype)


def copysign(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``|self|`` with the sign of ``other``; the result dtype follows type promotion."""
    dtype = torch.result_type(self, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    return torch.abs(self.to(dtype)) * _sign_factor(other, dtype)


def atan2(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """C's ``atan2(y = self, x = other)`` from ``atan``: ``atan2(|y|, x)`` by quadrant (a ``-0``
    ``x`` counts as negative; ``0 / 0`` and ``inf / inf`` by their tables), then the sign of ``y``
    (``atan2`` is odd in ``y``, signed zeros and all)."""
    dtype = torch.result_type(self, other)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    y, x = self.to(dtype), other.to(dtype)
    magnitude = torch.abs(y)
    x_negative = signbit(x)
    quotient = torch.atan(magnitude / x)
    general = torch.where(x_negative, quotient + math.pi, quotient)  # in [0, pi]
    zeros = torch.where(x_negative, math.pi, 0.0).to(dtype)  # atan2(+0, -0) = pi, atan2(+0, +0) = +0
    corners = torch.where(x_negative, 3 * math.pi / 4, math.pi / 4).to(dtype)
    both_zero = torch.logical_and(magnitude == 0, x == 0)
    both_infinite = torch.logical_and(torch.isinf(magnitude), torch.isinf(x))
    unsigned = torch.where(both_infinite, corners, torch.where(both_zero, zeros, general))
    return unsigned * _sign_factor(y, dtype)


#: op -> exact decomposition, for ``ExportedProgram.run_decompositions``
EXACT_DECOMPOSITIONS: dict[Any, Any] = {
    aten.atan2.default: atan2,
    aten.copysign.Tensor: copysign,
    aten.signbit.default: signbit,
}
