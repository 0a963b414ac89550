"""Negative results: what goes wrong without the flat protocol, on the real quantizers."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import Unsupported
from torch._subclasses.fake_tensor import FakeTensor

import tetrt_support.quant  # noqa: F401  (registers the quantizers as opaque value types)
from tetrt_support.quant.fake_impls import FAKE_IMPLS, get_strategy, hazards
from tetrt_support.quant.fake_impls.make_empty_traceable import make_empty_traceable
from tetrt_support.quant.recipes import RECIPES, get_recipe


def _activations(recipe: str) -> torch.Tensor:
    """A (32, 64) input; bf16 for nvfp4, whose input quantizer's Hadamard transform takes bf16 only (TE's rule)."""
    return torch.randn(32, 64, dtype=torch.bfloat16 if recipe == "nvfp4" else torch.float32)


@pytest.mark.parametrize("recipe", ["fp8_current", "nvfp4"])
def test_custom_op_returning_the_subclass_yields_fake_data_under_aot_eager(recipe: str) -> None:
    quantizer = get_recipe(recipe).input()
    x = _activations(recipe)
    eager = hazards.quantize_returning_subclass(quantizer, x, "eager")
    assert not any(isinstance(b, FakeTensor) for b in eager.inner_buffers().values())
    torch.testing.assert_close(eager.dequantize(), quantizer.quantize(x).dequantize(), rtol=0, atol=0)
    silently_wrong = hazards.quantize_returning_subclass(quantizer, x, "aot_eager")  # no error raised...
    assert type(silently_wrong) is type(eager)
    assert all(isinstance(b, FakeTensor) for b in silently_wrong.inner_buffers().values())  # ...but no data


@pytest.mark.parametrize("recipe", RECIPES)
def test_tensor_flatten_in_the_trace_breaks_the_graph(recipe: str) -> None:
    tensor = get_recipe(recipe).input().quantize(_activations(recipe))
    with pytest.raises(Unsupported, match=r"torch\.\* op returned non-Tensor"):
        hazards.flatten_in_trace(tensor)


@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_both_strategies_flatten_the_same_tensor_in_the_trace(fake_impl: str) -> None:
    quantizer = get_recipe("mxfp8").input()
    x = torch.randn(32, 64)
    tensor = make_empty_traceable(quantizer, x.shape, x.dtype)  # carries the stash for make_empty_traceable
    tensor.copy_(x)  # re-quantizes into the buffers
    strategy = get_strategy(fake_impl)
    torch._dynamo.reset()
    flat = torch.compile(strategy.flat_buffers, backend="eager", fullgraph=True)(tensor)
    assert [t.data_ptr() for t in flat] == [b.data_ptr() for b in tensor.inner_buffers().values()]


def test_make_empty_inside_the_trace_is_not_traceable() -> None:
    with pytest.raises(Unsupported, match="Failed to convert args/kwargs to proxy"):
        hazards.make_empty_in_trace(get_recipe("fp8_current").input(), torch.randn(32, 64))


def test_a_custom_op_may_not_return_its_cached_input() -> None:
    with pytest.raises(RuntimeError, match=r"must not also be an input to this custom operator"):
        hazards.returning_an_input(torch.randn(4), torch.randn(4))


@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8", "nvfp4"])
def test_only_the_descriptor_can_be_made_inside_the_trace(recipe: str) -> None:
    quantizer = get_recipe(recipe).input()
    x = _activations(recipe)
    rebuilt = hazards.template_and_reassemble_in_trace("tensor_proto", quantizer, x, "aot_eager")
    torch.testing.assert_close(rebuilt.dequantize(), quantizer.quantize(x).dequantize(), rtol=0, atol=0)
    with pytest.raises(Unsupported, match="Failed to convert args/kwargs to proxy"):
        hazards.template_and_reassemble_in_trace("make_empty_traceable", quantizer, x, "aot_eager")


def test_describing_inside_the_trace_trips_dynamo_on_a_property_of_the_quantizer() -> None:
    """torch 2.14: reading a @property (Float8BlockQuantizer.block_shape) of a value-opaque
    quantizer inside a trace fails an internal Dynamo assertion -- why the Linear hands
    its TensorProto in from outside the trace (``flat_buffers(..., like=...)``)."""
    with pytest.raises(AssertionError, match="cls_source must not be None for MRO walk"):
        hazards.template_and_reassemble_in_trace("tensor_proto", get_recipe("fp8_block").input(), torch.randn(32, 64))
