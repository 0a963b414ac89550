"""An engine block that receives a size (a SymInt) from outside works in every engine.

``n = counts.sum().item()`` is made in a PyTorch fallback block (``aten.item`` is in
``torch_executed_ops``, as an engine without data-dependent scalars would leave it) and
``arange(n)`` runs in an engine block: the int crosses the block boundary. Eager and
inductor take it as an int (inductor recompiles it symbolic when it changes); ONNX Runtime
takes it as a 0-d int64 input, converted in the engine's runtime wrapper.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.export import Dim

import tetrt_support
from tetrt_support.compiler.engines import get_engine
from tetrt_support.compiler.pipeline import PASSES, _dynamic_dims, build_engine_blocks, run_passes
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


class TrimToShorter(torch.nn.Module):
    """NeuCodec's encoder trims two branches to the shorter: ``min`` of two lengths is
    ``torch.sym_min`` of two ``sym_size`` reads, Python on sizes, no tensor op."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = min(a.shape[-1], b.shape[-1])
        return a[..., :n] * 2 + b[..., :n]


@pytest.mark.parametrize("strategy", ("rewrite", "retrace"))
@pytest.mark.parametrize("backend", ("eager", "onnxruntime"))
def test_the_shorter_of_two_lengths_is_read_inside_the_engine_block_not_in_a_fallback(
    backend: str, strategy: str
) -> None:
    """Before: ``sym_min`` stayed in the parent graph, its ``sym_size`` reads made a fallback
    block of their own (``1 engine block, 1 fallback block``), and the engine block took the
    minimum as an int input."""
    b = Dim("b", min=1, max=8)
    shapes = ({0: b, 1: Dim("la", min=2, max=16)}, {0: b, 1: Dim("lb", min=2, max=16)})
    args = (torch.randn(2, 5), torch.randn(2, 7))
    program = torch.export.export(TrimToShorter(), args, dynamic_shapes=shapes, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed engine build would warn and fall back
        compiled = tetrt_support.compile(
            program, backend=backend, strategy=strategy, min_block_size=1
        )
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    for a, b in ((torch.randn(3, 9), torch.randn(3, 4)), (torch.randn(1, 6), torch.randn(1, 6))):
        torch.testing.assert_close(compiled(a, b), TrimToShorter()(a, b))


class Framed(torch.nn.Module):
    """A codec's two inputs: a wave of ``4 * frames`` samples and one feature per frame."""

    def forward(self, wave: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        frames = torch.nn.functional.avg_pool1d(wave.unsqueeze(1), 4).squeeze(1)  # a strided conv
        return frames * feats


def test_a_block_input_sized_hop_times_frames_stays_tied_to_frames_in_the_engine() -> None:
    """Before: the wave's dim ``4*t`` became an engine dim of its own (``derived_0_1``), free
    of ``t``; Xcodec2's whole forward then failed its ONNX export (``Constraints violated
    (derived_0_2)``) and the engine block fell back to PyTorch. Now the engine exports it
    as ``4 * Dim(t)``, the same ``Dim`` as the features' frames."""
    from tetrt_support.compiler.engines.base import dynamic_shapes_for_export

    b, t = Dim("b", min=1, max=8), Dim("t", min=2, max=32)
    shapes = ({0: b, 1: 4 * t}, {0: b, 1: t})
    args = (torch.randn(2, 24), torch.randn(2, 6))
    program = torch.export.export(Framed(), args, dynamic_shapes=shapes, strict=False)
    settings = CompilationSettings(backend="onnxruntime", min_block_size=1)
    until_build = PASSES[: PASSES.index(build_engine_blocks)]
    gm = run_passes(program, "onnxruntime", "rewrite", until_build, settings)
    dims = _dynamic_dims(gm.engine_0)
    frames = dims[1][1]
    assert dims[1][0] == dims[0][0] and dims[0][1] == f"4*{frames}", dims
    wave_dims, feats_dims = dynamic_shapes_for_export(list(args), dims, gm.engine_0)
    assert wave_dims[1].root is feats_dims[1] and (wave_dims[1].min, feats_dims[1].max) == (8, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed engine build would warn and fall back
        compiled = tetrt_support.compile(program, backend="onnxruntime", min_block_size=1)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    for frames in (10, 2):
        wave, feats = torch.randn(3, 4 * frames), torch.randn(3, frames)
        torch.testing.assert_close(compiled(wave, feats), Framed()(wave, feats))
