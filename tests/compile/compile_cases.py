"""Models and helpers shared by the tests of ``tetrt_support.compile``.

:class:`OutputKindModel` crosses every output structure users return (tensor, tuple,
list, dict, namedtuple, registered dataclass, nested, Hugging Face ``ModelOutput``) with
every complex I/O case (real, complex input, complex output, both). Its body always has
an interior complex region (complex multiply), so the lowering has real work to do.
Compiled modules are cached per configuration: an ONNX Runtime build exports each block.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils import _pytree as pytree

# Imported before any export: transformers registers ModelOutput classes as pytree nodes
# at import, and an import first made inside a trace is not seen by that trace.
from transformers.modeling_outputs import BaseModelOutput

import tetrt_support

OUTPUT_KINDS = ("tensor", "tuple", "list", "dict", "namedtuple", "dataclass", "nested", "model_output")
IO_KINDS = ("real", "complex_in", "complex_out", "both")
CALL_STYLES = ("positional", "keyword", "mixed")

# One NT and one DC for every test: pytree registration is per class.
from tetrt_support.complex.signature_cases import DC, NT  # noqa: E402

def _model_output(a: torch.Tensor, b: torch.Tensor) -> Any:
    return BaseModelOutput(last_hidden_state=a, hidden_states=(b,))


class OutputKindModel(torch.nn.Module):
    """``x * y`` in complex arithmetic, returned in the structure ``kind`` names.

    ``a`` is the complex product (complex, or packed ``[..., 2]`` for real outputs), ``b`` a
    real value computed from it (its squared magnitude).
    """

    def __init__(self, kind: str, io: str) -> None:
        super().__init__()
        self.kind, self.io = kind, io

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        xc = x if self.io in ("complex_in", "both") else torch.view_as_complex(x)
        z = xc * torch.view_as_complex(y) + 1
        a = z if self.io in ("complex_out", "both") else torch.view_as_real(z)
        b = torch.view_as_real(z).pow(2).sum(-1)
        if self.kind == "tensor":
            return a
        if self.kind == "tuple":
            return a, b
        if self.kind == "list":
            return [a, b]
        if self.kind == "dict":
            return {"prod": a, "energy": b}
        if self.kind == "namedtuple":
            return NT(a, b)
        if self.kind == "dataclass":
            return DC(a, b)
        if self.kind == "nested":
            return a, [b, {"k": b * 2}], NT(a, b)
        if self.kind == "model_output":
            return _model_output(a, b)
        raise ValueError(kind)


def inputs_for(io: str, batch: int = 2, seq: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, 4, 2, generator=g)
    y = torch.randn(batch, seq, 4, 2, generator=g)
    if io in ("complex_in", "both"):
        x = torch.view_as_complex(x)
    return x, y


@functools.cache
def exported(kind: str, io: str) -> torch.export.ExportedProgram:
    return torch.export.export(OutputKindModel(kind, io), inputs_for(io), strict=False)


@functools.cache
def compiled(kind: str, io: str, strategy: str, backend: str) -> Any:
    return tetrt_support.compile(exported(kind, io), backend=backend, strategy=strategy)


def call(module: Any, style: str, x: torch.Tensor, y: torch.Tensor) -> Any:
    if style == "positional":
        return module(x, y)
    if style == "keyword":
        return module(x=x, y=y)
    if style == "mixed":
        return module(x, y=y)
    raise ValueError(style)


def assert_same_outputs(expected: Any, actual: Any, atol: float = 1e-5) -> None:
    """Same pytree structure (types, keys, fields), same dtypes and shapes, close values."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    assert act_spec == exp_spec, f"structure differs:\n expected {exp_spec}\n got      {act_spec}"
    assert type(actual) is type(expected)
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        assert isinstance(a, torch.Tensor), f"leaf {i}: {type(a).__name__}"
        assert a.dtype == e.dtype, f"leaf {i}: dtype {a.dtype}, expected {e.dtype}"
        assert a.shape == e.shape, f"leaf {i}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-4)
