"""quant.Linear's custom ops with changing token counts, and with none.

A new batch or sequence length in training must cost at most one recompile (the second
size makes the dimension dynamic) under ``fullgraph=True``: the fake impls describe the
quantized input's buffers from its symbolic shape, which an ``int()`` would specialise
(a guard on that one size, a recompile per size, and the recompile limit's hard error).
An empty batch must run too: its quantized buffers share storage (an empty tensor is
contiguous in every layout), which the op's no-aliasing rule must still see.

aot_eager runs every recipe and fake impl; eager and inductor (the slowest to compile)
one recipe each.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import tetrt_support.quant  # noqa: F401  (registers the quantizers as opaque value types)
from tetrt_support.quant.fake_impls import FAKE_IMPLS
from tetrt_support.quant.linear import Linear
from tetrt_support.quant.recipes import RECIPES
from tetrt_support.report.fake_impl_measure import fp32_recipe

IN, OUT = 64, 32
# Multiples of 128 tokens: every recipe's column-wise blocks tile them.
TOKENS = [128 * i for i in range(1, 9)]
CASES = [(r, f, "aot_eager") for r in RECIPES for f in FAKE_IMPLS] + [
    ("fp8_block", "make_empty_traceable", "eager"),
    ("fp8_current", "make_empty_traceable", "inductor"),
]


def _layer(recipe: str, fake_impl: str) -> Linear:
    torch.manual_seed(0)
    return Linear(IN, OUT, recipe=fp32_recipe(recipe), fake_impl=fake_impl, compile_as="custom_ops")


def _step(fn, layer: Linear, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output and the three gradients of one forward + backward (nvfp4's stochastic
    rounding draws its seeds from torch's generator: seeded alike for both runs)."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(1)
    y = fn(x)
    y.backward(grad)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _check_changing_shapes(recipe: str, fake_impl: str, backend: str, shapes: list[tuple[int, ...]]) -> None:
    from torch._dynamo.utils import counters

    layer = _layer(recipe, fake_impl)
    torch._dynamo.reset()
    counters.clear()
    counting = CompileCounterWithBackend(backend)
    compiled = torch.compile(layer, backend=counting, fullgraph=True)
    g = torch.Generator().manual_seed(2)
    for shape in shapes:
        x = torch.randn(*shape, IN, generator=g)
        grad = torch.randn(*shape, OUT, generator=g)
        expected = _step(layer, layer, x, grad)
        got = _step(compiled, layer, x, grad)
        for name, e, c in zip(("out", "dgrad", "wgrad", "dbias"), expected, got):
            torch.testing.assert_close(c, e, rtol=0, atol=0, msg=lambda m, n=name, s=shape: f"{n} at {s}: {m}")
    assert counting.frame_count <= 2, f"{counting.frame_count} compiles for {len(shapes)} shapes"
    assert sum(counters["graph_break"].values()) == 0


@pytest.mark.parametrize(("recipe", "fake_impl", "backend"), CASES)
def test_changing_batch_size_recompiles_at_most_once(recipe: str, fake_impl: str, backend: str) -> None:
    _check_changing_shapes(recipe, fake_impl, backend, [(m,) for m in TOKENS])


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_changing_sequence_length_recompiles_at_most_once(recipe: str, fake_impl: str) -> None:
    _check_changing_shapes(recipe, fake_impl, "aot_eager", [(2, m // 2) for m in TOKENS])


@pytest.mark.parametrize("recipe", RECIPES)
def test_marked_dynamic_batch_is_not_specialised(recipe: str) -> None:
    layer = _layer(recipe, "tensor_proto")
    torch._dynamo.reset()
    counting = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counting, fullgraph=True)
    for m in TOKENS[1:4]:  # from 256: at 128 a block-scale grid of one row guards on that 1
        x = torch.randn(m, IN, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 0)  # raised "specialized it to be a constant" when a fake impl int()ed it
        compiled(x).sum().backward()
    assert counting.frame_count == 1


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_empty_batch_trains_eager_and_compiled(recipe: str, fake_impl: str) -> None:
    layer = _layer(recipe, fake_impl)
    x, grad = torch.randn(0, IN), torch.randn(0, OUT)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    for fn in (layer, compiled):
        out, dgrad, wgrad, dbias = _step(fn, layer, x, grad)
        assert out.shape == (0, OUT) and dgrad.shape == (0, IN)
        torch.testing.assert_close(wgrad, torch.zeros_like(layer.weight), rtol=0, atol=0)
        torch.testing.assert_close(dbias, torch.zeros_like(layer.bias), rtol=0, atol=0)
