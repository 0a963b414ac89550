"""Hypothesis strategies that draw tensors, so a failing example shrinks to a small one.

Drawing the values themselves (rather than a seed for ``torch.randn``) lets hypothesis
simplify a counterexample element by element; where a test still needs a random
generator, :func:`seeds` draws its seed inside each example, so every example is
reproducible on its own.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def finite_floats(dtype: torch.dtype = torch.float32, bound: float = 10.0) -> st.SearchStrategy[float]:
    """Finite floats in ``[-bound, bound]`` representable in ``dtype``."""
    width = 32 if dtype == torch.float32 else 64
    return st.floats(-bound, bound, allow_nan=False, allow_infinity=False, width=width)


def tensors(
    shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    dtype: torch.dtype = torch.float32,
    elements: st.SearchStrategy[float] | None = None,
) -> st.SearchStrategy[torch.Tensor]:
    """Real tensors of ``shape`` and ``dtype`` (float32 or float64), drawn element by element."""
    if dtype not in _NUMPY:
        raise ValueError(f"tensors() draws float32 or float64, got {dtype}")
    elements = finite_floats(dtype) if elements is None else elements
    return hnp.arrays(_NUMPY[dtype], shape, elements=elements).map(torch.from_numpy)


def complex_tensors(
    shape: tuple[int, ...], dtype: torch.dtype = torch.complex64, bound: float = 10.0
) -> st.SearchStrategy[torch.Tensor]:
    """Complex tensors of ``shape``, drawn as real ``[..., 2]`` pairs."""
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    pairs = tensors((*shape, 2), real, finite_floats(real, bound))
    return pairs.map(lambda t: torch.view_as_complex(t.contiguous()))


def seeds() -> st.SearchStrategy[int]:
    """A seed drawn per example (for code that needs its own generator)."""
    return st.integers(0, 2**31 - 1)


def examples(ci: int) -> int:
    """A per-test example count: ``ci`` under the CI profile, the profile's own count under ``fuzz``.

    Use as ``@settings(max_examples=examples(12))`` so that a slow property keeps a small CI
    budget without capping the fuzz profile.
    """
    from hypothesis import settings

    current = settings()
    return ci if current.derandomize else current.max_examples
