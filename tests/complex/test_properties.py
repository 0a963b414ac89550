"""Random programs built from the supported complex ops: lowered == eager, both strategies.

A program is a list of steps over a growing list of values (step i reads earlier values
and appends one). Hypothesis draws the steps while the program runs eagerly on the
example input, so every drawn dim and index is valid for the shapes at that point.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st
from torch.export import Dim

from tests.complex.complex_testing import STRATEGIES, pack
from tests.strategies import finite_floats, tensors

from tetrt_support.complex import complex_nodes, lower

UNARY = {
    "neg": lambda a: -a,
    "conj": lambda a: a.conj(),
    "exp": lambda a: (a * 0.1).exp(),
    "sin": lambda a: (a * 0.1).sin(),
    "cos": lambda a: (a * 0.1).cos(),
    "tanh": lambda a: (a * 0.1).tanh(),
    "sqrt": lambda a: a.sqrt(),
    "square": lambda a: a**2,
    "times_i": lambda a: a * 1j,
    "reciprocal": lambda a: (a + 3).reciprocal(),
    "polar_of_abs_angle": lambda a: torch.polar(a.abs(), a.angle()),
    "complex_of_real_imag": lambda a: torch.complex(a.real, a.imag * 0.5),
    "real_to_complex": lambda a: a.real.to(a.dtype) + a.imag,
    "view_as_real_roundtrip": lambda a: torch.view_as_complex(torch.view_as_real(a.resolve_conj()) * 2),
    "clone": lambda a: a.clone(),
}
BINARY_OPERANDS = ("reduced_complex", "reduced_real", "real_scalar", "complex_scalar")


def _operand(a: torch.Tensor, kind: str, dim: int) -> Any:
    if kind == "reduced_complex":
        return a.mean(dim, keepdim=True)  # broadcasts against a
    if kind == "reduced_real":
        return a.real.sum(dim, keepdim=True)
    return 1.5 if kind == "real_scalar" else (0.5 - 1.5j)


def apply(step: tuple, vals: list[torch.Tensor]) -> torch.Tensor:
    op, i, *p = step
    a = vals[i]
    if op in UNARY:
        return UNARY[op](a)
    if op in ("add", "sub", "mul", "div"):
        b = _operand(a, p[0], p[1])
        if op == "div":
            b = b + 3 if isinstance(b, torch.Tensor) else b
        return {"add": lambda: a + b, "sub": lambda: b - a, "mul": lambda: a * b, "div": lambda: a / b}[op]()
    if op == "sum":
        return a.sum(p[0], keepdim=p[1])
    if op == "mean":
        return a.mean(p[0], keepdim=p[1])
    if op == "transpose":
        return a.transpose(p[0], p[1])
    if op == "permute":
        return a.permute(*p[0])
    if op == "unsqueeze":
        return a.unsqueeze(p[0])
    if op == "flip":
        return a.flip(p[0])
    if op == "roll":
        return a.roll(p[0], p[1])
    if op == "cat":
        return torch.cat([a, vals[p[1]]], p[0]) if p[1] is not None else torch.cat([a, a * 2], p[0])
    if op == "select":
        return a.select(p[0], p[1])
    if op == "slice":
        return a.narrow(p[0], p[1], p[2])
    if op == "flatten":
        return a.flatten()
    if op == "matmul":
        return a @ a.transpose(-1, -2)
    if op == "where":
        return torch.where(a.real > 0, a, a.conj() * 2)
    raise AssertionError(op)


class Program(nn.Module):
    def __init__(self, steps: list[tuple]) -> None:
        super().__init__()
        self.steps = steps

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vals = [torch.view_as_complex(x)]
        for step in self.steps:
            vals.append(apply(step, vals))
        return torch.view_as_real(vals[-1].resolve_conj()), vals[-1].abs()


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[tuple], torch.Tensor, bool]:
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    shape = [draw(st.integers(2, 4))] + draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    # The values are drawn (not a seed for randn), so a failing program shrinks to small,
    # simple inputs; within +-2, as randn's values mostly are, so (a + 3) stays invertible.
    x = draw(tensors((*shape, 2), dtype, finite_floats(dtype, 2.0)))
    dynamic = draw(st.integers(0, 2)) == 0  # a third of the programs get a dynamic batch
    vals = [torch.view_as_complex(x)]
    steps: list[tuple] = []
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(vals) - 1))
        a = vals[i]
        r = a.dim()
        categories = {
            "unary": sorted(UNARY),
            "binary": ["add", "sub", "mul", "div", "where"],
            "shape": [] if dynamic else ["transpose", "permute", "unsqueeze", "flip", "roll", "cat", "flatten"]
            + (["select", "slice"] if r >= 2 else []),
            "reduce": ["sum", "mean", "matmul"] if r >= 2 and not dynamic else [],
        }
        category = draw(st.sampled_from([c for c, ops in categories.items() if ops]))
        op = draw(st.sampled_from(categories[category]))
        dim = lambda: draw(st.integers(-r, r - 1))  # noqa: E731
        if op in ("add", "sub", "mul", "div"):
            d = draw(st.integers(1, r - 1)) if dynamic and r > 1 else dim()
            step = (op, i, draw(st.sampled_from(BINARY_OPERANDS)) if not (dynamic and r == 1) else "real_scalar", d)
        elif op in ("sum", "mean"):
            step = (op, i, dim(), draw(st.booleans()))
        elif op == "transpose":
            step = (op, i, dim(), dim())
        elif op == "permute":
            step = (op, i, draw(st.permutations(range(r))))
        elif op == "unsqueeze":
            step = (op, i, draw(st.integers(-r - 1, r)))
        elif op == "flip":
            step = (op, i, draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True)))
        elif op == "roll":
            step = (op, i, draw(st.integers(-3, 3)), dim())
        elif op == "cat":
            d = dim()
            same = [j for j, v in enumerate(vals) if v.dim() == r and all(
                v.shape[k] == a.shape[k] for k in range(r) if k != d % r)]
            step = (op, i, d, draw(st.sampled_from(same)) if draw(st.booleans()) else None)
        elif op == "select":
            d = dim()
            step = (op, i, d, draw(st.integers(-a.shape[d], a.shape[d] - 1)))
        elif op == "slice":
            d = dim()
            start = draw(st.integers(0, a.shape[d] - 1))
            step = (op, i, d, start, draw(st.integers(1, a.shape[d] - start)))
        else:
            step = (op, i)
        steps.append(step)
        vals.append(apply(step, vals))
    return steps, x, dynamic


@given(programs())
def test_random_programs_lower_to_eager_numbers(case: tuple[list[tuple], torch.Tensor, bool]) -> None:
    steps, x, dynamic = case
    model = Program(steps)
    shapes = {"x": {0: Dim.AUTO}} if dynamic else None
    ep = torch.export.export(model, (x,), dynamic_shapes=shapes, strict=False)
    inputs = [x]
    if dynamic:
        bigger = torch.randn(x.shape[0] + 2, *x.shape[1:], dtype=x.dtype)
        if isinstance(ep.module().graph.find_nodes(op="placeholder")[0].meta["val"].shape[0], torch.SymInt):
            inputs.append(bigger)
    for strategy in STRATEGIES:
        gm = lower(ep, strategy)
        assert complex_nodes(gm) == [], (strategy, steps)
        for inp in inputs:
            expected = pack(model(inp))
            got = gm(inp)
            tol = {"rtol": 1e-4, "atol": 1e-4} if x.dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
            torch.testing.assert_close(got, expected, **tol, msg=lambda m: f"{strategy} {steps}: {m}")
