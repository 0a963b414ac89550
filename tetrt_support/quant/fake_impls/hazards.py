"""Minimal reproductions of what goes wrong WITHOUT the flat protocol.

Each builds the smallest honest case on real quantizers and returns the wrong result or lets
the real error escape: :func:`quantize_returning_subclass` (an op returning the subclass gives
FakeTensor buffers under ``aot_eager``), :func:`flatten_in_trace` (``__tensor_flatten__`` in
traced code graph-breaks), :func:`make_empty_in_trace` (``make_empty`` copies the quantizer,
which Dynamo cannot pass on as the registered constant), :func:`returning_an_input`
(torch.library refuses an op returning its input).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tetrt_support.quant.base import QuantizedTensor, Quantizer
from tetrt_support.quant.ops import OP_NAMESPACE, opaque_type_name


@functools.cache
def _subclass_op(quantizer_cls: type) -> Any:
    name = f"{OP_NAMESPACE}::hazard_quantize_returning_subclass_{quantizer_cls.__name__.lower()}"

    def impl(x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
        return quantizer.quantize(x)

    op = torch.library.custom_op(name, impl, mutates_args=(), schema=f"(Tensor x, {opaque_type_name(quantizer_cls)} quantizer) -> Tensor")

    @op.register_fake
    def _(x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
        return quantizer.make_empty(x.shape, dtype=x.dtype, device=x.device)

    return op


def quantize_returning_subclass(quantizer: Quantizer, x: torch.Tensor, backend: str) -> QuantizedTensor:
    """Compile ``op(x, quantizer)`` -- an op returning the subclass itself -- and call it."""
    op = _subclass_op(type(quantizer))
    torch._dynamo.reset()
    return torch.compile(lambda t: op(t, quantizer), backend=backend, fullgraph=True)(x)


def flatten_in_trace(tensor: QuantizedTensor, backend: str = "eager") -> list[torch.Tensor]:
    """Take ``tensor`` apart in compiled code the obvious way: ``__tensor_flatten__``."""

    def take_apart(t: QuantizedTensor) -> list[torch.Tensor]:
        names, _ = t.__tensor_flatten__()
        return [getattr(t, name) for name in names]

    torch._dynamo.reset()
    return torch.compile(take_apart, backend=backend, fullgraph=True)(tensor)


def make_empty_in_trace(quantizer: Quantizer, x: torch.Tensor, backend: str = "eager") -> torch.Tensor:
    """Allocate the quantized tensor for ``x`` inside compiled code with ``make_empty``."""

    def allocate(t: torch.Tensor) -> torch.Tensor:
        empty = quantizer.make_empty(t.shape, dtype=t.dtype, device=t.device)
        return t.new_tensor(float(empty.shape[-1]))

    torch._dynamo.reset()
    return torch.compile(allocate, backend=backend, fullgraph=True)(x)


@functools.cache
def _aliasing_op() -> Any:
    def impl(x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, cache  # the cached buffer handed back as a "saved" output

    op = torch.library.custom_op(f"{OP_NAMESPACE}::hazard_return_cached_input", impl, mutates_args=(),
                                 schema="(Tensor x, Tensor cache) -> (Tensor, Tensor)")
    op.register_fake(lambda x, cache: (torch.empty_like(x), torch.empty_like(cache)))
    return op


def returning_an_input(x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Call an op that returns one of its inputs (eagerly)."""
    return _aliasing_op()(x, cache)


def template_and_reassemble_in_trace(fake_impl: str, quantizer: Quantizer, x: torch.Tensor, backend: str = "eager") -> QuantizedTensor:
    """Quantize ``x`` eagerly, then build the strategy's template AND reassemble from the
    flat buffers inside compiled code: a TensorProto can be made there, an allocation
    through ``make_empty`` cannot (see :func:`make_empty_in_trace`)."""
    from tetrt_support.quant.fake_impls import get_strategy
    from tetrt_support.quant.ops import flatten_quantized

    strategy = get_strategy(fake_impl)

    def rebuild(*buffers: torch.Tensor) -> QuantizedTensor:
        template = strategy.fake_quantized(quantizer, x.shape, x.dtype, x.device)
        return strategy.reassemble(template, list(buffers))

    torch._dynamo.reset()
    return torch.compile(rebuild, backend=backend, fullgraph=True)(*flatten_quantized(quantizer.quantize(x)))
