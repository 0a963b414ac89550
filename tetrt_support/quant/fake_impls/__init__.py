"""Two interchangeable ways to give the Linear custom ops their fake (meta) implementations.

The forward op returns its saved quantized tensors as plain buffers, so its fake impl must
know which buffers a quantizer WOULD produce. ``"tensor_proto"`` (:mod:`.tensor_proto`)
carries that in a descriptor dataclass; ``"make_empty_traceable"``
(:mod:`.make_empty_traceable`) allocates an empty quantized tensor and stashes its flatten
names, so traced code never calls ``__tensor_flatten__``. Both implement
:class:`FakeImplStrategy`; :func:`get_strategy` picks one by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from tetrt_support.quant.base import QuantizedTensor, Quantizer


@runtime_checkable
class FakeImplStrategy(Protocol):
    """What the custom-op plumbing in :mod:`tetrt_support.quant.ops` needs from a strategy."""

    name: str

    def fake_quantized(
        self, quantizer: Quantizer, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> object:
        """The strategy's stand-in for ``quantizer.quantize(x)`` inside a fake impl."""
        ...

    def flat_fake(self, value: object) -> list[torch.Tensor]:
        """The flat tensors a fake impl returns for a value made by :meth:`fake_quantized`."""
        ...

    def flat_buffers(self, tensor: QuantizedTensor, like: object = None) -> list[torch.Tensor]:
        """The inner buffers of ``tensor`` in flatten order, without calling ``__tensor_flatten__``
        (safe inside a Dynamo trace). ``like``: this strategy's stand-in for such a tensor, made
        outside the trace, for a strategy that would otherwise derive the names there."""
        ...

    def reassemble(self, value: object, flat: Sequence[torch.Tensor]) -> QuantizedTensor:
        """The quantized tensor ``value`` (from :meth:`fake_quantized`, any device) stands for,
        over the given flat buffers. Safe inside a Dynamo trace when ``value`` was made
        outside it."""
        ...


FAKE_IMPLS: tuple[str, ...] = ("make_empty_traceable", "tensor_proto")


def get_strategy(name: str) -> FakeImplStrategy:
    """The strategy called ``name``; a ValueError names the valid ones."""
    if name == "make_empty_traceable":
        from tetrt_support.quant.fake_impls.make_empty_traceable import STRATEGY
    elif name == "tensor_proto":
        from tetrt_support.quant.fake_impls.tensor_proto import STRATEGY
    else:
        raise ValueError(f"unknown fake_impl {name!r}; valid fake impls: {', '.join(FAKE_IMPLS)}")
    return STRATEGY
