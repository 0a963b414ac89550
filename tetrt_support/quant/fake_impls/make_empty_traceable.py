"""Fake impls through allocation: ``make_empty_traceable``.

Instead of describing a quantized tensor, allocate one: ``quantizer.make_empty`` builds
a real (uninitialised) quantized tensor -- under fake mode its buffers are fake tensors,
which is exactly what a fake impl must return. Its flatten names and context are read
ONCE, at allocation, and stashed as plain attributes (``_te_flat_names``,
``_te_flat_ctx``): Dynamo treats non-callable attributes of a traceable wrapper subclass
as constants, so traced code reads them instead of calling ``__tensor_flatten__``, whose
non-tensor result graph-breaks ("torch.* op returned non-Tensor").

Cost of the idea: every tensor that traced code flattens must carry the stash (made here
or stamped with :func:`stash_flatten`); a tensor from plain ``quantize`` has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tetrt_support.quant.base import QuantizedTensor, Quantizer

FLAT_NAMES_ATTR = "_te_flat_names"
FLAT_CTX_ATTR = "_te_flat_ctx"


def stash_flatten(tensor: QuantizedTensor) -> QuantizedTensor:
    """Record ``tensor``'s flatten names and context as plain attributes (eager only)."""
    names, ctx = tensor.__tensor_flatten__()
    setattr(tensor, FLAT_NAMES_ATTR, tuple(names))
    setattr(tensor, FLAT_CTX_ATTR, ctx)
    return tensor


def make_empty_traceable(
    quantizer: Quantizer, shape: Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> QuantizedTensor:
    """An empty quantized tensor whose flatten names and context travel as attributes."""
    return stash_flatten(quantizer.make_empty(shape, dtype=dtype, device=device))


def _stashed_names(tensor: QuantizedTensor) -> tuple[str, ...]:
    names = getattr(tensor, FLAT_NAMES_ATTR, None)
    if names is None:
        raise TypeError(
            f"{type(tensor).__name__} carries no {FLAT_NAMES_ATTR}: make it with make_empty_traceable or "
            "stamp it with stash_flatten before tracing (calling __tensor_flatten__ in a trace graph-breaks)"
        )
    return names


class MakeEmptyTraceableStrategy:
    """:class:`~tetrt_support.quant.fake_impls.FakeImplStrategy` built on :func:`make_empty_traceable`."""

    name = "make_empty_traceable"

    def fake_quantized(
        self, quantizer: Quantizer, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> QuantizedTensor:
        return make_empty_traceable(quantizer, shape, dtype, device)

    def flat_fake(self, value: object) -> list[torch.Tensor]:
        return [getattr(value, name) for name in _stashed_names(value)]  # type: ignore[arg-type]

    def flat_buffers(self, tensor: QuantizedTensor, like: object = None) -> list[torch.Tensor]:
        del like  # the tensor carries its own names
        return [getattr(tensor, name) for name in _stashed_names(tensor)]

    def reassemble(self, value: object, flat: Sequence[torch.Tensor]) -> QuantizedTensor:
        names = _stashed_names(value)  # type: ignore[arg-type]
        if len(flat) != len(names):
            raise ValueError(
                f"make_empty_traceable reassemble: {type(value).__name__} of shape "
                f"{tuple(value.shape)} has "  # type: ignore[attr-defined]
                f"{len(names)} buffers {names}, got {len(flat)} tensors"
            )
        for name, tensor in zip(names, flat):
            like = getattr(value, name)
            if tensor.shape != like.shape or tensor.dtype != like.dtype:
                raise ValueError(
                    f"make_empty_traceable reassemble: buffer {name} should be "
                    f"{tuple(like.shape)} {like.dtype}, got {tuple(tensor.shape)} {tensor.dtype}"
                )
        ctx = getattr(value, FLAT_CTX_ATTR)
        unflatten = type(value).__tensor_unflatten__  # type: ignore[attr-defined]
        tensor = unflatten(dict(zip(names, flat)), ctx, value.shape, None)
        setattr(tensor, FLAT_NAMES_ATTR, names)
        setattr(tensor, FLAT_CTX_ATTR, ctx)
        return tensor


STRATEGY = MakeEmptyTraceableStrategy()
