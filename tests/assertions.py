"""The one output comparison the tests share."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree


def assert_same_outputs(expected: Any, actual: Any, *, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Same pytree structure (types, keys, fields), same dtypes and shapes, close values."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    assert act_spec == exp_spec, f"structure differs:\n expected {exp_spec}\n got      {act_spec}"
    assert type(actual) is type(expected), f"got a {type(actual).__name__}, expected a {type(expected).__name__}"
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        assert isinstance(a, torch.Tensor), f"leaf {i}: {type(a).__name__}"
        assert a.dtype == e.dtype, f"leaf {i}: dtype {a.dtype}, expected {e.dtype}"
        assert a.shape == e.shape, f"leaf {i}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
