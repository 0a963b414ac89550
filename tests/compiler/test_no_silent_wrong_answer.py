"""Reproductions of the compiler bugs a Hugging Face sweep found, each failing on the
pipeline as it was and passing now; and the build-time check that catches a wrong engine."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.export import Dim

import tetrt_support
from tetrt_support.compiler import pipeline
from tetrt_support.compiler.functionalize import functionalize_view_writes
from tetrt_support.compiler.settings import CompilationSettings
from tetrt_support.compiler.verify import EngineMismatchError
from tetrt_support.zoo.reproductions import InPlaceAdd, SizeInPython, SliceWrites, compile_as_before, slice_writes_program

ENGINES = ("eager", "onnxruntime")
STRATEGIES = ("rewrite", "retrace")


_slice_writes_program = slice_writes_program


def test_old_pipeline_returns_the_uninitialised_buffer_from_onnxruntime() -> None:
    """The silent wrong answer: the writes land in a block of their own, after the engine
    block has read the buffer (no data edge says it must wait), and nothing complains."""
    program, args = _slice_writes_program()
    compiled = compile_as_before(program)
    assert compiled.blocks_summary().startswith("1 engine block")
    assert not torch.allclose(compiled(*args), SliceWrites()(*args))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_slice_writes_into_new_empty_are_functionalized(engine: str, strategy: str) -> None:
    program, args = _slice_writes_program()
    compiled = tetrt_support.compile(program, backend=engine, strategy=strategy, min_block_size=1)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    torch.testing.assert_close(compiled(*args), SliceWrites()(*args), rtol=0, atol=0)
    inner = [op for b in compiled.blocks() for op in b.ops]
    assert "aten.copy_.default" not in inner


def test_the_build_time_check_catches_the_lost_write_without_functionalization() -> None:
    program, args = _slice_writes_program()
    passes = tuple(p for p in pipeline.PASSES if p is not functionalize_view_writes)
    # The write runs in PyTorch (engines refuse in-place ops), its buffer in the engine block:
    # the uninitialised buffer trips the block check, or else the whole-program check.
    with pytest.raises(EngineMismatchError, match=r"does not match (PyTorch|the exported program) on the example inputs.*output \d+"):
        pipeline.run_passes(program, "onnxruntime", "rewrite", passes, CompilationSettings(min_block_size=1))


class _Broken(torch.nn.Module):
    """A deliberately wrong engine block: the right graph, plus one."""

    def __init__(self, built: torch.nn.Module) -> None:
        super().__init__()
        self.built = built

    def forward(self, *inputs: torch.Tensor):
        return self.built(*inputs) + 1


def _break_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    from tetrt_support.compiler.engines.eager import EagerEngine

    build = EagerEngine.build
    monkeypatch.setattr(EagerEngine, "build", lambda self, *a, **k: _Broken(build(self, *a, **k)))


class Small(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3 - x


def test_a_broken_engine_block_raises_naming_block_output_and_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_builds(monkeypatch)
    x = torch.randn(2, 5)
    program = torch.export.export(Small(), (x,), strict=False)
    with pytest.raises(EngineMismatchError, match=r"eager engine's engine block engine_0 \(\d+ ops\).*output 0 .*differs by up to 1"):
        tetrt_support.compile(program, backend="eager", min_block_size=1)


def test_a_broken_engine_block_falls_back_with_a_warning_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_builds(monkeypatch)
    x = torch.randn(2, 5)
    program = torch.export.export(Small(), (x,), strict=False)
    with pytest.warns(UserWarning, match=r"engine block engine_0 .*does not match PyTorch.*runs in PyTorch as fallback_engine_0"):
        compiled = tetrt_support.compile(program, backend="eager", min_block_size=1, on_engine_mismatch="fallback")
    assert compiled.blocks_summary() == "0 engine blocks, 1 fallback block"
    torch.testing.assert_close(compiled(x), Small()(x))


def test_the_check_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_builds(monkeypatch)
    x = torch.randn(2, 5)
    program = torch.export.export(Small(), (x,), strict=False)
    compiled = tetrt_support.compile(program, backend="eager", min_block_size=1, check_engine_blocks=False)
    torch.testing.assert_close(compiled(x), Small()(x) + 1)  # the broken engine, unchecked


def test_an_unknown_mismatch_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown on_engine_mismatch 'ignore'"):
        CompilationSettings(on_engine_mismatch="ignore")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_in_place_add_and_detach_of_literals_stay_in_one_onnxruntime_block(strategy: str) -> None:
    ids = torch.arange(6).reshape(2, 3)
    program = torch.export.export(InPlaceAdd(), (ids,), strict=False)
    compiled = tetrt_support.compile(program, backend="onnxruntime", strategy=strategy, min_block_size=1)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    torch.testing.assert_close(compiled(ids), InPlaceAdd()(ids))


@pytest.mark.parametrize("engine", ("eager", "inductor", "onnxruntime"))
def test_a_size_computed_in_python_is_no_plain_int_block_input(engine: str) -> None:
    x = torch.randn(2, 3, 4)
    shapes = ({0: Dim("b", min=1, max=8), 1: Dim("s", min=2, max=16)},)
    program = torch.export.export(SizeInPython(), (x,), dynamic_shapes=shapes, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed engine build would warn and fall back
        compiled = tetrt_support.compile(program, backend=engine, min_block_size=1)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    other = torch.randn(3, 5, 4)
    torch.testing.assert_close(compiled(other), SizeInPython()(other))


class NoGradRegion(torch.nn.Module):
    """A ``torch.no_grad()`` region with a weight: ``ep.module()`` starts with get_attr nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(3.0))

    def forward(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = x * self.w + 1
        return torch.view_as_real(z * 2).sum(-1) + y


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_no_grad_region_compiles_with_either_strategy(strategy: str) -> None:
    """On the old pipeline ``strategy="rewrite"`` raised "Argument 'z' of Node
    'check_complex_inputs' was used before it has been defined": the input check went before
    the first non-placeholder node, a get_attr that precedes the inputs."""
    g = torch.Generator().manual_seed(0)
    z, x = torch.randn(2, 3, dtype=torch.complex64, generator=g), torch.randn(2, 3, generator=g)
    program = torch.export.export(NoGradRegion(), (z, x), strict=False)
    assert next(iter(program.module().graph.nodes)).op == "get_attr"
    compiled = tetrt_support.compile(program, backend="onnxruntime", strategy=strategy, min_block_size=1)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    torch.testing.assert_close(compiled(z, x), NoGradRegion()(z, x))
    with pytest.raises(TypeError, match="complex"):
        compiled(x, x)  # the input check still runs first


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_check_bounds_low_precision_outputs_in_their_own_ulps(dtype: torch.dtype) -> None:
    """A correct bf16/fp16 engine rounds elsewhere than PyTorch by a few ulps (a float32
    bound would reject it); an engine off by the size of the values is still refused."""
    from tetrt_support.compiler.verify import LOW_PRECISION_ULPS, compare_outputs, relative_tolerance

    eps = torch.finfo(dtype).eps
    assert relative_tolerance(dtype) == LOW_PRECISION_ULPS * eps
    assert relative_tolerance(torch.float32) == 1e-4
    expected = torch.linspace(-1, 1, 64, dtype=torch.float32).to(dtype)
    reordered = (expected.float() + 2 * eps * torch.sign(expected.float())).to(dtype)  # two ulps of the largest value
    assert compare_outputs([expected], [reordered]) is None
    wrong = (expected.float() * 1.1).to(dtype)
    assert "differs by up to" in compare_outputs([expected], [wrong])


class NoGradThenWeightNorm(torch.nn.Module):
    """A codec's encoder in small: a ``torch.no_grad()`` region (its semantic model) and then
    a weight-normed convolution, exported with grad mode on as users export."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(2, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = x.mean(1, keepdim=True) * 2
            with torch.enable_grad():  # a region in the region
                y = y - 1
        return self.conv(x) + y[..., 1:-1]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_weight_norm_after_a_no_grad_region_compiles_and_leaves_grad_mode_alone(
    strategy: str,
) -> None:
    """Before, with ``strategy="retrace"``: the retrace recorded the region as
    ``_set_grad_enabled(False)`` ... ``_set_grad_enabled(True)``, constant folding ran both,
    folded the weight norm with grad on into non-leaf tensors, and keeping the reference
    blocks failed (``Only Tensors created explicitly by the user (graph leaves) support the
    deepcopy protocol``); the compiled module also turned grad mode on in a no_grad caller."""
    model = NoGradThenWeightNorm().eval()
    x = torch.randn(2, 2, 8)
    program = torch.export.export(model, (x,), strict=False)
    compiled = tetrt_support.compile(
        program, backend="onnxruntime", strategy=strategy, min_block_size=1
    )
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert all(t.is_leaf for t in compiled.buffers())
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        assert not torch.is_grad_enabled()


def test_a_block_with_a_non_leaf_constant_is_kept_for_the_check_without_deepcopy() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from tetrt_support.compiler.verify import reference_copy

    weight = torch.nn.Parameter(torch.randn(3))
    block = make_fx(lambda x: x * 2)(torch.randn(3))
    block.register_buffer("w", weight * 2)  # non-leaf, as a weight norm computed with grad on
    assert not block.w.is_leaf
    copied = reference_copy(block)
    assert copied.w.is_leaf and copied.w.requires_grad and torch.equal(copied.w, block.w)
    assert copied.w.data_ptr() != block.w.data_ptr()  # a write into one leaves the other


def test_a_block_that_cannot_be_copied_is_not_checked_and_the_compile_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tetrt_support.compiler import verify

    def refuse(block: torch.nn.Module) -> torch.nn.Module:
        raise RuntimeError("cannot copy this")

    monkeypatch.setattr(verify, "reference_copy", refuse)
    x = torch.randn(2, 5)
    program = torch.export.export(Small(), (x,), strict=False)
    match = r"engine block engine_0 is not checked .*RuntimeError: cannot copy this"
    with pytest.warns(UserWarning, match=match):
        compiled = tetrt_support.compile(program, backend="eager", min_block_size=1)
    torch.testing.assert_close(compiled(x), Small()(x))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_no_grad_region_exported_with_grad_on_runs_in_the_engine_block(strategy: str) -> None:
    """Before, with ``strategy="rewrite"``: the region stayed a ``wrap_with_set_grad_enabled``
    call in the parent graph, run by PyTorch between the blocks and counted in none, and with
    a dynamic length the sizes it took made a fallback block holding only ``sym_size.int``."""
    model = NoGradThenWeightNorm().eval()
    shapes = ({0: Dim("b", min=1, max=8), 2: Dim("t", min=4, max=64)},)
    x = torch.randn(2, 2, 8)
    program = torch.export.export(model, (x,), dynamic_shapes=shapes, strict=False)

    def has_region(gm: torch.fx.GraphModule) -> bool:
        return any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)

    def code(gm: torch.fx.GraphModule) -> str:
        return gm.print_readable(print_output=False)

    assert has_region(program.graph_module)
    before = code(program.graph_module)
    compiled = tetrt_support.compile(
        program, backend="onnxruntime", strategy=strategy, min_block_size=1
    )
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert not has_region(compiled)
    assert code(program.graph_module) == before  # its regions (shared by ep.module()) as they were
    with torch.no_grad():
        for x in (torch.randn(3, 2, 11), torch.randn(1, 2, 4)):
            torch.testing.assert_close(compiled(x), model(x))
