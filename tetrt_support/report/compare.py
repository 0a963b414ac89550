"""Numeric comparison of two outputs, for notebooks and benchmarks.

Tests assert closeness with ``torch.testing``; a notebook or a results file wants one
number per comparison. :func:`max_abs_error` is that number, and it refuses to compare
outputs whose structure differs: a lowering that changes the number of outputs, a shape
or real-versus-complex is wrong, not "a bit inaccurate".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["max_abs_error", "tensor_leaves"]


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors among the pytree leaves of ``value``, in pytree order."""
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def max_abs_error(expected: Any, actual: Any) -> float:
    """Largest ``|expected - actual|`` over the tensor leaves of two pytrees.

    Complex leaves compare through ``view_as_real``. The containers may differ (a plain
    dict where the model returned a ``ModelOutput``); the leaf count, the shapes and
    real-versus-complex may not, and a difference there raises ``ValueError``.
    """
    want, got = tensor_leaves(expected), tensor_leaves(actual)
    if len(want) != len(got):
        raise ValueError(f"expected {len(want)} tensor outputs, got {len(got)}")
    worst = 0.0
    for i, (w, g) in enumerate(zip(want, got)):
        if w.shape != g.shape or w.is_complex() != g.is_complex():
            raise ValueError(
                f"output {i}: expected {'complex' if w.is_complex() else 'real'} {list(w.shape)}, "
                f"got {'complex' if g.is_complex() else 'real'} {list(g.shape)}"
            )
        if w.is_complex():
            w, g = torch.view_as_real(w), torch.view_as_real(g)
        if w.numel():
            worst = max(worst, float((w.detach().double() - g.detach().double()).abs().max()))
    return worst
