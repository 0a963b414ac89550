"""An engine block that receives a size (a SymInt) from outside works in every engine.

``n = counts.sum().item()`` is made in a PyTorch fallback block (``aten.item`` is in
``torch_executed_ops``, as an engine without data-dependent scalars would leave it) and
``arange(n)`` runs in an engine block: the int crosses the block boundary. Eager and
inductor take it as an int (inductor recompiles it symbolic when it changes); ONNX Runtime
takes it as a 0-d int64 input, converted in the engine's runtime wrapper.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import tetrt_support
from tetrt_support.compiler.engines import get_engine
from tetrt_support.compiler.pipeline import PASSES, build_engine_blocks, run_passes
from tetrt_support.compiler.settings import CompilationSettings
from tetrt_support.zoo.reproductions import ITEM_IN_PYTORCH, CountThenArange


def _program() -> torch.export.ExportedProgram:
    args = (torch.randn(3, 4), torch.tensor([2, 3]))
    return torch.export.export(CountThenArange(), args, dynamic_shapes=({0: Dim("b", min=2, max=8)}, None), strict=False)


def test_partitioning_leaves_a_symint_crossing_into_an_engine_block() -> None:
    settings = CompilationSettings(backend="eager", strategy="rewrite", min_block_size=1, torch_executed_ops=ITEM_IN_PYTORCH)
    gm = run_passes(_program(), "eager", "rewrite", PASSES[: PASSES.index(build_engine_blocks)], settings)
    engine_inputs = [
        ph.meta.get("val")
        for name, block in gm.named_children()
        if name.startswith("engine_")
        for ph in block.graph.find_nodes(op="placeholder")
    ]
    assert any(isinstance(v, torch.SymInt) for v in engine_inputs), engine_inputs


@pytest.mark.parametrize("backend", ("eager", "inductor", "onnxruntime"))
def test_an_engine_block_with_a_symint_input_runs_for_every_size(backend: str) -> None:
    compiled = tetrt_support.compile(_program(), backend=backend, min_block_size=1, torch_executed_ops=ITEM_IN_PYTORCH)
    assert compiled.blocks_summary() == "2 engine blocks, 1 fallback block"  # no block fell back
    model = CountThenArange()
    for x, counts in [(torch.randn(5, 4), torch.tensor([4, 5])), (torch.randn(3, 4), torch.tensor([2, 3])), (torch.randn(2, 4), torch.tensor([1, 6]))]:
        torch.testing.assert_close(compiled(x, counts), model(x, counts))


@pytest.mark.parametrize("backend", ("eager", "inductor", "onnxruntime"))
def test_an_int_block_input_is_taken_and_other_scalars_are_refused(backend: str) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    block = make_fx(lambda x, n: torch.arange(n, dtype=x.dtype) + x.sum(), tracing_mode="symbolic")(torch.randn(3), 4)
    built = get_engine(backend).build(block, [torch.randn(3), 4])
    x = torch.randn(3)
    for n in (4, 7):
        torch.testing.assert_close(built(x, n), torch.arange(n, dtype=x.dtype) + x.sum())
    with pytest.raises(TypeError, match=f"{backend} engine: block input 1 is a str; engine blocks take tensors and ints"):
        get_engine(backend).build(block, [x, "4"])


def test_an_int_input_that_export_would_specialise_is_an_error_not_a_constant() -> None:
    """torch.export specialises an int example of 1: the ONNX model would return the n = 1
    result for every n. The engine refuses, naming the input."""
    from torch.fx.experimental.proxy_tensor import make_fx

    block = make_fx(lambda x, n: torch.arange(n, dtype=x.dtype) + x.sum(), tracing_mode="symbolic")(torch.randn(3), 4)
    with pytest.raises(ValueError, match=r"block input 1 \(an int, 1 in the example\) was specialised"):
        get_engine("onnxruntime").build(block, [torch.randn(3), 1])


class FlatBufferFromPyTorch(torch.nn.Module):
    """``full((b * s,))`` runs in PyTorch and feeds an engine block: the block input's only
    dim is the expression ``b * s``, not a symbol of the program."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape
        return torch.arange(b * s, dtype=x.dtype) * x.flatten() + torch.full((b * s,), 2.0)


@pytest.mark.parametrize("backend", ("eager", "inductor", "onnxruntime"))
def test_a_block_input_sized_by_an_expression_of_dims_stays_dynamic(backend: str) -> None:
    shapes = ({0: Dim("b", min=1, max=8), 1: Dim("s", min=2, max=16)},)
    program = torch.export.export(FlatBufferFromPyTorch(), (torch.randn(2, 3),), dynamic_shapes=shapes, strict=False)
    compiled = tetrt_support.compile(
        program, backend=backend, min_block_size=1, torch_executed_ops={"torch.ops.aten.full.default"}
    )
    assert "1 engine block" in compiled.blocks_summary()
    for x in (torch.randn(4, 5), torch.randn(2, 3)):
        torch.testing.assert_close(compiled(x), FlatBufferFromPyTorch()(x))
