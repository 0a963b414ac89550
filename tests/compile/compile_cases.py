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

import tetrt_support

# One model for the package's notebook matrix and these tests; one NT and one DC for
# every test (pytree registration is per class).
from tetrt_support.complex.signature_cases import DC, NT  # noqa: E402,F401
from tetrt_support.complex.signature_cases import OutputModel as OutputKindModel  # noqa: E402

OUTPUT_KINDS = ("tensor", "tuple", "list", "dict", "namedtuple", "dataclass", "nested", "model_output")
IO_KINDS = ("real", "complex_in", "complex_out", "both")
CALL_STYLES = ("positional", "keyword", "mixed")
inputs_for = OutputKindModel.inputs


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
