"""Fake impls through a descriptor: ``TensorProto``.

A ``TensorProto`` says what a quantized tensor WOULD be -- its quantizer, logical shape,
fake dtype and the name, shape and dtype of every inner buffer (from
``Quantizer.describe_buffers``) -- without allocating anything. A fake impl returns
protos; a later step materialises them into the flat fake tensors the op returns, or
reassembles real buffers into the quantized tensor the proto describes. The descriptor
is pure Python data, so Dynamo reads it as constants and never sees
``__tensor_flatten__``.

Cost of the idea: a second description of every format (``describe_buffers`` must agree
with what ``quantize`` and ``__tensor_flatten__`` produce), checked here on every use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tetrt_support.quant.base import as_dims

if TYPE_CHECKING:
    from tetrt_support.quant.base import QuantizedTensor, Quantizer


@dataclass(frozen=True)
class BufferProto:
    """One inner buffer of a quantized tensor: its attribute name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class TensorProto:
    """A quantized tensor described, not allocated."""

    quantizer: Quantizer
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    buffers: tuple[BufferProto, ...]

    @classmethod
    def describe(
        cls, quantizer: Quantizer, shape: Sequence[int], dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> TensorProto:
        """The proto of ``quantizer.quantize(x)`` for an ``x`` of this shape, dtype and device."""
        shape = as_dims(shape)  # not int(): a symbolic batch size must stay symbolic
        spec = quantizer.describe_buffers(shape, device=device)
        order = type(quantizer).tensor_class._FLATTEN_TENSOR_BUFFERS
        unknown = [name for name in spec if name not in order]
        if unknown:
            raise ValueError(
                f"TensorProto: {type(quantizer).__name__}.describe_buffers names buffer(s) {unknown} that "
                f"{type(quantizer).tensor_class.__name__} does not flatten (its buffers: {order})"
            )
        buffers = tuple(BufferProto(name, tuple(spec[name][0]), spec[name][1])
                        for name in order if name in spec)
        return cls(quantizer, shape, dtype, torch.device(device), buffers)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers)

    @property
    def slot_count(self) -> int:
        """How many flat tensors this quantized tensor occupies in an op's inputs or outputs."""
        return len(self.buffers)

    def materialize(self) -> list[torch.Tensor]:
        """Empty tensors for every buffer (fake tensors when called under fake mode)."""
        return [torch.empty(b.shape, dtype=b.dtype, device=self.device) for b in self.buffers]

    def reassemble(self, flat: Sequence[torch.Tensor]) -> QuantizedTensor:
        """The quantized tensor this proto describes, over the given flat buffers."""
        if len(flat) != self.slot_count:
            raise ValueError(
                f"TensorProto.reassemble: {type(self.quantizer).__name__} for shape {self.shape} has "
                f"{self.slot_count} buffers {self.names}, got {len(flat)} tensors"
            )
        for proto, tensor in zip(self.buffers, flat):
            if tuple(tensor.shape) != proto.shape or tensor.dtype != proto.dtype:
                raise ValueError(
                    f"TensorProto.reassemble: buffer {proto.name} should be {proto.shape} {proto.dtype}, "
                    f"got {tuple(tensor.shape)} {tensor.dtype}"
                )
        tensor_class = type(self.quantizer).tensor_class
        return tensor_class(shape=self.shape, dtype=self.dtype, quantizer=self.quantizer, **dict(zip(self.names, flat)))


class TensorProtoStrategy:
    """:class:`~tetrt_support.quant.fake_impls.FakeImplStrategy` built on :class:`TensorProto`."""

    name = "tensor_proto"

    def fake_quantized(
        self, quantizer: Quantizer, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> TensorProto:
        return TensorProto.describe(quantizer, shape, dtype, device)

    def flat_fake(self, value: object) -> list[torch.Tensor]:
        if not isinstance(value, TensorProto):
            raise TypeError(f"tensor_proto fake impl: expected a TensorProto, got {type(value).__name__}")
        return value.materialize()

    def flat_buffers(self, tensor: QuantizedTensor, like: object = None) -> list[torch.Tensor]:
        # Describing inside a trace runs the quantizer's Python under Dynamo, which some
        # quantizers do not survive (a @property on an opaque value object trips an
        # internal assertion in torch 2.14); a proto made beforehand avoids that.
        proto = like if like is not None else TensorProto.describe(
            tensor._quantizer, tensor.shape, tensor.dtype, tensor.device)
        if not isinstance(proto, TensorProto):
            raise TypeError(
                f"tensor_proto flat_buffers: like must be a TensorProto, got {type(proto).__name__}")
        return [getattr(tensor, name) for name in proto.names]

    def reassemble(self, value: object, flat: Sequence[torch.Tensor]) -> QuantizedTensor:
        if not isinstance(value, TensorProto):
            raise TypeError(f"tensor_proto reassemble: expected a TensorProto, got {type(value).__name__}")
        return value.reassemble(flat)


STRATEGY = TensorProtoStrategy()
