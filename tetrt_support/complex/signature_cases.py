"""The models of the Torch-TensorRT signature review, and the matrix that compares fixes.

Each case is one small model with complex numbers somewhere: inside only, at an input,
at an output, in a multi-output block, or in an op without a complex rule (eig). The
matrix compiles every case under each :class:`~tetrt_support.complex.signature.SignaturePolicy`
on both lowering strategies, calls it by position and by keyword, and says in a few
words what happened (computed, never typed: a cell is what the run did).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

# Imported before any export: transformers registers its ModelOutput classes as pytree
# nodes at import, and a registration first made inside a trace is not seen by it.
from transformers.modeling_outputs import BaseModelOutput

__all__ = [
    "CASES",
    "DC",
    "NT",
    "Case",
    "CumsumBetween",
    "Eig",
    "Eigvals",
    "OutputModel",
    "describe_outcome",
    "output_mismatch",
    "signature_matrix",
]

NT = collections.namedtuple("NT", ["a", "b"])


@dataclasses.dataclass
class DC:
    a: torch.Tensor
    b: torch.Tensor


torch.export.register_dataclass(DC)


class OutputModel(torch.nn.Module):
    """``x * y`` in complex arithmetic, returned in the structure ``kind`` names.

    Kinds: tensor, tensor_1x4, tuple, list, dict, namedtuple, dataclass, nested,
    model_output (an HF ``BaseModelOutput``).

    ``io`` says where complex values cross the model's edge: ``"real"`` (interior only),
    ``"complex_in"`` (x is complex), ``"complex_out"`` (the product is returned complex)
    or ``"both"``. ``a`` is the product, ``b`` its squared magnitude (always real).
    """

    def __init__(self, kind: str = "tensor", io: str = "real") -> None:
        super().__init__()
        self.kind, self.io = kind, io

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        xc = x if self.io in ("complex_in", "both") else torch.view_as_complex(x)
        z = xc * torch.view_as_complex(y) + 1
        a = z if self.io in ("complex_out", "both") else torch.view_as_real(z)
        b = torch.view_as_real(z).pow(2).sum(-1)
        kind = self.kind
        if kind == "tensor":
            return a
        if kind == "tensor_1x4":
            return b.reshape(1, -1)[:, :4]
        if kind == "tuple":
            return a, b
        if kind == "list":
            return [a, b]
        if kind == "dict":
            return {"prod": a, "energy": b}
        if kind == "namedtuple":
            return NT(a, b)
        if kind == "dataclass":
            return DC(a, b)
        if kind == "nested":
            return a, [b, {"k": b * 2}], NT(a, b)
        if kind == "model_output":
            return BaseModelOutput(last_hidden_state=a, hidden_states=(b,))
        raise ValueError(f"unknown output kind {kind!r}")

    @staticmethod
    def inputs(io: str = "real", batch: int = 2, seq: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, seq, 4, 2, generator=g)
        y = torch.randn(batch, seq, 4, 2, generator=g)
        return (torch.view_as_complex(x) if io in ("complex_in", "both") else x), y


class Eig(torch.nn.Module):
    """``torch.linalg.eig`` has no complex rule: it runs, complex, in a PyTorch block."""

    def forward(self, x: torch.Tensor) -> Any:
        return torch.linalg.eig(x + 1)


class Eigvals(torch.nn.Module):
    """The single-output sibling of :class:`Eig`: the block call itself is the output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigvals(x + 1)


class CumsumBetween(torch.nn.Module):
    """complex multiply (engine) -> complex cumsum (no rule: PyTorch) -> complex multiply (engine)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        z = torch.view_as_complex(x) * torch.view_as_complex(y)
        c = torch.cumsum(z, dim=1)
        return {"out": torch.view_as_real(c * torch.view_as_complex(y)), "norm": c.abs()}


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of the matrix: a model, its inputs, and how to call it by keyword."""

    label: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], dict[str, torch.Tensor]]  # seed -> keyword inputs, in order


def _xy(io: str) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda seed: dict(zip(("x", "y"), OutputModel.inputs(io, seed=seed)))


def _square(seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))}


CASES: tuple[Case, ...] = (
    Case("interior complex, tensor output", lambda: OutputModel("tensor", "real"), _xy("real")),
    Case("interior complex, namedtuple output", lambda: OutputModel("namedtuple", "real"), _xy("real")),
    Case("interior complex, dataclass output", lambda: OutputModel("dataclass", "real"), _xy("real")),
    Case("complex input", lambda: OutputModel("tensor", "complex_in"), _xy("complex_in")),
    Case("complex output", lambda: OutputModel("tensor", "complex_out"), _xy("complex_out")),
    Case("complex and real outputs of one block (dict)", lambda: OutputModel("dict", "complex_out"), _xy("complex_out")),
    Case("eig in a fallback block (2 complex outputs)", Eig, _square),
    Case("eigvals in a fallback block (1 complex output)", Eigvals, _square),
)


def output_mismatch(expected: Any, actual: Any, atol: float = 1e-4) -> str | None:
    """None if ``actual`` has ``expected``'s structure, dtypes, shapes and values; else why not."""
    exp_leaves, exp_spec = pytree.tree_flatten_with_path(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if act_spec != pytree.tree_structure(expected):
        if isinstance(actual, dict) and all(isinstance(v, str) for v in actual.values()):
            return "returned the dict's keys"
        if type(actual) is not type(expected):
            return f"returned a {type(actual).__name__}, not a {type(expected).__name__}"
        return f"returned a {type(actual).__name__} of another structure"
    for (path, e), a in zip(exp_leaves, act_leaves):
        where = pytree.keystr(path) or "output"
        if not isinstance(a, torch.Tensor):
            return f"{where} returned a {type(a).__name__}"
        if a.is_complex() != e.is_complex():
            return f"{where} returned {'complex' if a.is_complex() else 'real'} {tuple(a.shape)}"
        if a.shape != e.shape:
            return f"{where} returned shape {tuple(a.shape)}"
        if not torch.allclose(a, e, atol=atol, rtol=1e-4):
            return f"{where} returned wrong values"
    return None


def _outcome(fn: Callable[[], Any], expected: Any) -> str:
    try:
        actual = fn()
    except Exception as e:  # noqa: BLE001 - the matrix reports every failure by its type
        return f"{type(e).__name__}"
    return output_mismatch(expected, actual) or "ok"


def describe_outcome(by_strategy: dict[str, dict[str, str]]) -> str:
    """Fold {strategy: {"position": outcome, "keyword": outcome}} into one short cell."""
    strategies = list(by_strategy)
    if all(o == "ok" for r in by_strategy.values() for o in r.values()):
        return "✓"
    position_ok = [s for s in strategies if by_strategy[s]["position"] == "ok"]
    keyword_bad = [s for s in strategies if by_strategy[s]["keyword"] != "ok"]
    if len(position_ok) == len(strategies) and keyword_bad:
        return "by position only" + ("" if len(keyword_bad) == len(strategies) else f" on the {keyword_bad[0]} path")
    wrong = []
    for s in strategies:
        o = by_strategy[s]["position"]
        if o != "ok" and o not in wrong:
            wrong.append(o if len(strategies) == 1 or all(by_strategy[t]["position"] == o for t in strategies) else f"{o} ({s})")
    return "✗ " + "; ".join(wrong)


def signature_matrix(
    policies: Sequence[Any], cases: Sequence[Case] = CASES, strategies: Sequence[str] = ("rewrite", "retrace"),
    backend: str = "eager",
) -> list[tuple[str, ...]]:
    """One row per case, one cell per policy: what calling the compiled module did."""
    from tetrt_support.complex.compiler import compile_with_policy

    rows = []
    for case in cases:
        model = case.build()
        example = case.inputs(0)
        program = torch.export.export(model, tuple(example.values()), strict=False)
        fresh = case.inputs(1)
        expected = model(**fresh)
        cells = []
        for policy in policies:
            by_strategy = {}
            for strategy in strategies:
                module = compile_with_policy(program, backend, strategy, policy)
                by_strategy[strategy] = {
                    "position": _outcome(lambda: module(*fresh.values()), expected),
                    "keyword": _outcome(lambda: module(**fresh), expected),
                }
            cells.append(describe_outcome(by_strategy))
        rows.append((case.label, *cells))
    return rows
