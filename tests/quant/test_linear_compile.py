"""quant.Linear under torch.compile(fullgraph=True): both fake-impl strategies, every recipe.

Matrix: strategy x recipe x backend x {forward, backward}. eager and aot_eager run the
whole matrix. inductor runs the TRAINING case only (it compiles the forward and the
backward graph, so it covers both directions) for every strategy x recipe: a separate
forward-only inductor case would add eight more C++ compiles (~5-20 s each on a loaded
2-core box) and exercise nothing the training case does not.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import tetrt_support.quant  # noqa: F401  (registers the quantizers as opaque value types)
from tetrt_support.quant.fake_impls import FAKE_IMPLS
from tetrt_support.report.fake_impl_measure import fp32_recipe, tiny_mlp, train
from tetrt_support.quant.recipes import RECIPES, get_recipe

# Compiled vs eager run of the SAME quantized model: they differ only where a compiler
# reorders fp32 arithmetic and a value then lands on the other side of a rounding
# boundary of the format; the coarser the format, the larger one such flip.
LOSS_RTOL = {"fp8_current": 1e-3, "fp8_block": 1e-3, "mxfp8": 1e-3, "nvfp4": 1e-2}


def _data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 64, generator=g), torch.randn(32, 32, generator=g)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_forward_compiles_without_breaks_or_recompiles(recipe: str, fake_impl: str, backend: str) -> None:
    from torch._dynamo.utils import counters

    model = tiny_mlp(recipe, fake_impl)
    x, _ = _data()
    torch._dynamo.reset()
    counters.clear()
    counting = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counting, fullgraph=True)
    with torch.no_grad():
        expected = [model(x * s) for s in (1.0, 0.5, 2.0)]
        got = [compiled(x * s) for s in (1.0, 0.5, 2.0)]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] == 1
    assert sum(counters["graph_break"].values()) == 0
    assert counting.frame_count == 1  # three calls, one compiled frame


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_training_matches_eager_without_breaks_or_recompiles(recipe: str, fake_impl: str, backend: str) -> None:
    x, target = _data()
    eager, _ = train(tiny_mlp(recipe, fake_impl), x, target, steps=3)
    compiled_model = tiny_mlp(recipe, fake_impl)
    compiled, _ = train(compiled_model, x, target, steps=3, backend=backend)
    assert compiled.frames == 1, "recompiled across training steps"
    assert compiled.graphs == 1
    assert compiled.graph_breaks == 0
    torch.testing.assert_close(compiled.losses, eager.losses, rtol=LOSS_RTOL[recipe], atol=0)
    assert compiled.losses[-1] < compiled.losses[0], "SGD did not lower the loss"
    # The last step's gradients reached every parameter through the backward custom op.
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in compiled_model.parameters())


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_cached_weight_is_reused_without_recompiles(fake_impl: str, recipe: str) -> None:
    """is_first_microbatch=True caches the quantized weight (rebuilt inside the trace from
    the op's flat outputs); False feeds the cache back in as flat inputs."""
    from torch._dynamo.utils import counters
    from torch._subclasses.fake_tensor import FakeTensor

    from tetrt_support.quant.linear import Linear

    torch.manual_seed(0)
    layer = Linear(64, 32, recipe=fp32_recipe(recipe), fake_impl=fake_impl, compile_as="custom_ops")
    x, _ = _data()
    expected = layer(x).detach()

    def step(inp: torch.Tensor, first: bool) -> torch.Tensor:
        return layer(inp, is_first_microbatch=first)

    torch._dynamo.reset()
    counters.clear()
    counting = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counting, fullgraph=True)
    first = compiled(x, True)
    cache = layer._weight_cache
    assert type(cache) is type(layer.weight_quantizer).tensor_class
    assert not any(isinstance(b, FakeTensor) for b in cache.inner_buffers().values())
    torch.testing.assert_close(cache.dequantize(), layer.weight_quantizer.quantize(layer.weight).dequantize(), rtol=0, atol=0)
    reused = [compiled(x * s, False) for s in (1.0, 0.5)]
    reused[0].sum().backward()
    torch.testing.assert_close(first.detach(), expected, rtol=0, atol=0)
    torch.testing.assert_close(reused[0].detach(), expected, rtol=0, atol=0)
    assert layer.weight.grad is not None and layer.weight.grad.shape == (32, 64)
    assert counting.frame_count == 2  # one graph for True, one for False; none for the repeat
    assert sum(counters["graph_break"].values()) == 0


def test_reuse_without_a_cache_is_a_miss_that_caches() -> None:
    """TE's ``quantize_weight``: no workspace yet -> quantize the weight and keep it."""
    from tetrt_support.quant.linear import Linear

    layer = Linear(64, 32)
    x = torch.randn(4, 64)
    first = layer(x, is_first_microbatch=False)
    assert layer._weight_cache is not None
    torch.testing.assert_close(first, layer(x), rtol=0, atol=0)  # the same bytes as quantizing afresh
    with torch.no_grad():
        layer.weight.add_(1.0)
    torch.testing.assert_close(layer(x, is_first_microbatch=False), first, rtol=0, atol=0)  # the cache serves


@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_recipe_object_with_options_trains_compiled_in_one_frame(fake_impl: str) -> None:
    """A Recipe from get_recipe(name, **options) reaches every Linear; compiled training still
    has one frame, one graph, no graph break, and the eager losses. In bf16: training
    quantizes the row-scaled input column-wise too, which TE's kernels take from bf16 only."""
    recipe = get_recipe("nvfp4", row_scaled_activation=True, disable_rht=True, nvfp4_4over6="weights")
    x, target = (t.bfloat16() for t in _data())
    eager, _ = train(tiny_mlp(recipe, fake_impl).bfloat16(), x, target, steps=3)
    model = tiny_mlp(recipe, fake_impl).bfloat16()
    assert all(m.input_quantizer.row_scaled_nvfp4 and m.weight_quantizer.nvfp4_use_4over6
               for m in model if hasattr(m, "input_quantizer"))
    compiled, _ = train(model, x, target, steps=3, backend="aot_eager")
    assert (compiled.frames, compiled.graphs, compiled.graph_breaks) == (1, 1, 0)
    torch.testing.assert_close(compiled.losses, eager.losses, rtol=LOSS_RTOL["nvfp4"], atol=0)


def test_compiled_nvfp4_linear_on_fp32_raises_the_quantizers_error() -> None:
    """The fake impls do not check dtypes; the real op does, so a compiled fp32 nvfp4 Linear
    fails at its first call with the quantizer's own message, not a later silent result."""
    from tetrt_support.quant.linear import Linear

    torch._dynamo.reset()
    compiled = torch.compile(Linear(64, 32, recipe="nvfp4"), backend="aot_eager", fullgraph=True)
    with pytest.raises(TypeError, match=r"with_rht=True takes torch\.bfloat16 input only.*rht_any_input_dtype=True"):
        compiled(torch.randn(32, 64))
