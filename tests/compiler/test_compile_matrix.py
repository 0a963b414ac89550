"""The compiled module is called exactly like ``ep.module()`` and returns what it returns.

Output structure x call style x lowering strategy x complex I/O x engine. Compiled modules
are cached per (structure, I/O, strategy, engine); each is then called in all three styles.
ONNX Runtime exports every engine block (about a second each), so it runs the full
structure x I/O grid on the rewrite path and the both-complex column on the retrace path.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.assertions import assert_same_outputs
from tests.compiler.cases import (
    CALL_STYLES,
    IO_KINDS,
    OUTPUT_KINDS,
    call,
    compiled,
    inputs_for,
    OutputKindModel,
)

EAGER_GRID = list(itertools.product(OUTPUT_KINDS, IO_KINDS, ("rewrite", "retrace")))
ORT_GRID = [(k, io, "rewrite") for k in OUTPUT_KINDS for io in IO_KINDS] + [
    (k, "both", "retrace") for k in OUTPUT_KINDS
]


def _check(kind: str, io: str, strategy: str, backend: str, style: str) -> None:
    module = compiled(kind, io, strategy, backend)
    # different values from the export's example: the module must compute, not replay
    x, y = inputs_for(io, seed=1)
    expected = OutputKindModel(kind, io)(x, y)
    assert_same_outputs(expected, call(module, style, x, y))


@pytest.mark.parametrize("style", CALL_STYLES)
@pytest.mark.parametrize(("kind", "io", "strategy"), EAGER_GRID)
def test_eager_engine_keeps_signature(kind: str, io: str, strategy: str, style: str) -> None:
    _check(kind, io, strategy, "eager", style)


@pytest.mark.parametrize("style", CALL_STYLES)
@pytest.mark.parametrize(("kind", "io", "strategy"), ORT_GRID)
def test_onnxruntime_engine_keeps_signature(kind: str, io: str, strategy: str, style: str) -> None:
    _check(kind, io, strategy, "onnxruntime", style)


# inductor compiles each block's generated code (seconds on two cores): one structure per I/O kind
@pytest.mark.parametrize(("kind", "io"), [("dict", "both"), ("dataclass", "complex_in")])
def test_inductor_engine_keeps_signature(kind: str, io: str) -> None:
    for style in CALL_STYLES:
        _check(kind, io, "rewrite", "inductor", style)


@pytest.mark.parametrize(("kind", "io", "strategy"), [("dict", "both", "rewrite"), ("nested", "both", "retrace")])
def test_interior_complex_region_is_one_engine_block(kind: str, io: str, strategy: str) -> None:
    module = compiled(kind, io, strategy, "onnxruntime")
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    (block,) = module.blocks()
    assert block.kind == "engine" and block.runner == "OnnxRuntimeBlock"
    assert not any("complex" in op or "view_as_real" in op for op in block.ops), block.ops


def test_complex_inputs_and_outputs_stay_complex_outside() -> None:
    module = compiled("dict", "both", "rewrite", "onnxruntime")
    assert module.complex_io() == {"inputs": [torch.complex64, None], "outputs": [torch.complex64, None]}
    x, y = inputs_for("both", seed=2)
    out = module(x=x, y=y)
    assert out["prod"].dtype == torch.complex64 and out["prod"].shape == x.shape
    assert out["energy"].dtype == torch.float32
