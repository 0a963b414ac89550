"""Helpers shared by the tests of tetrt_support.complex: export a function, lower it by
both strategies, and compare the lowered module with eager PyTorch."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from tetrt_support.complex import complex_nodes, lower
from tetrt_support.complex.lower import STRATEGIES  # noqa: F401 - the tests parametrize over it


class Fn(nn.Module):
    """A module whose forward is ``fn`` (export needs a module)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def export(module: nn.Module | Callable[..., Any], args: tuple, *, kwargs: dict | None = None, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    if not isinstance(module, nn.Module):
        module = Fn(module)
    return torch.export.export(module, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)


def pack(value: Any) -> Any:
    """Complex tensors as their real [..., 2] form (how a lowered module takes/returns them)."""
    return pytree.tree_map_only(torch.Tensor, lambda t: torch.view_as_real(t.resolve_conj()) if t.is_complex() else t, value)


def tolerance(*values: Any) -> dict[str, float]:
    leaves = [t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]
    if any(t.dtype in (torch.complex128, torch.float64) for t in leaves):
        return {"rtol": 1e-10, "atol": 1e-10}
    return {"rtol": 1e-4, "atol": 1e-4}


def assert_lowered_matches(
    module: nn.Module | Callable[..., Any],
    args: tuple,
    *,
    strategies: Sequence[str] = STRATEGIES,
    dynamic_shapes: Any = None,
    check_args: Sequence[tuple] = (),
    **tol: float,
) -> dict[str, torch.fx.GraphModule]:
    """Export ``module`` on ``args``, lower it by each strategy, assert no complex node is
    left and that the lowered module matches eager on ``args`` and on each of
    ``check_args`` (other shapes, for dynamic programs)."""
    module = module if isinstance(module, nn.Module) else Fn(module)
    ep = export(module, args, dynamic_shapes=dynamic_shapes)
    lowered = {}
    for strategy in strategies:
        gm = lower(ep, strategy)
        assert complex_nodes(gm) == [], f"{strategy}: complex nodes left: {complex_nodes(gm)}"
        for a in (args, *check_args):
            expected = pack(module(*a))
            got = gm(*pack(a))
            torch.testing.assert_close(got, expected, **(tol or tolerance(a, expected)), msg=lambda m: f"{strategy}: {m}")
        lowered[strategy] = gm
    return lowered


def crandn(*shape: int, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)
