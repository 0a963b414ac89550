"""Lower complex-number ATen graphs (rotary embeddings, Llama 4) to real arithmetic.

A compiler without complex dtypes (TensorRT, ONNX Runtime) needs every complex value
carried as a real ``[..., 2]`` pair. This package does that the two ways Torch-TensorRT
does, over ONE shared table of per-op rules:

- :func:`lower` with ``strategy="rewrite"``: in-place FX rewrite of the exported graph;
- :func:`lower` with ``strategy="retrace"``: an ``fx.Interpreter`` under ``make_fx``.

:func:`complex_nodes` finds the work, :data:`RULES` is the table,
:class:`UnsupportedComplexOp` names an op without a rule, and
:mod:`tetrt_support.complex.codegen` keeps the call signature across a retrace.
"""

from __future__ import annotations

from tetrt_support.complex.codegen import restore_signature, retrace_preserving_signature
from tetrt_support.complex.detect import complex_nodes
from tetrt_support.complex.errors import UnsupportedComplexOp
from tetrt_support.complex.lower import complex_io, lower
from tetrt_support.complex.rules import RULES, RuleContext

__all__ = [
    "RULES",
    "RuleContext",
    "UnsupportedComplexOp",
    "complex_io",
    "complex_nodes",
    "lower",
    "restore_signature",
    "retrace_preserving_signature",
]
