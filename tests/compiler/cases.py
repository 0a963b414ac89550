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

import tetrt_support
from tests.models import OutputModel as OutputKindModel

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

